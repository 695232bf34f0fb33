"""The models the qonnx wheel ships (`qonnx/data/onnx/`): Brevitas' ESPCN in both variants,
`eltwise_chanlast_testcase`, `mnist-conv`, `residual_block_clean`, compared with qonnx's
executor (layer by layer where the model is quantized) and run on the RTL."""

from pathlib import Path

import numpy as np
import onnx
import pytest
import qonnx
from onnx import numpy_helper
from qonnx.core.modelwrapper import ModelWrapper
from qonnx.core.onnx_exec import execute_onnx
from qonnx.transformation.infer_shapes import InferShapes

from hwonnx import api
from hwonnx.config import ArchConfig
from qonnx_helpers import ORT_CONFIG, reference, steps
from rtl_helpers import rtl_matches_golden

DATA = Path(qonnx.__file__).parent / "data" / "onnx"
#: ESPCN on an 8x8 crop of its test image needs deeper buffers than ORT_CONFIG.
ESPCN_CONFIG = ArchConfig(rows=4, cols=4, act_depth=8192, wgt_depth=16384, acc_depth=16,
                          par_depth=256, prog_depth=8192, ort_rounding=True)


def cropped(path: Path, size: int, factor: int = 1) -> onnx.ModelProto:
    """The model at ``path`` with its input's height and width set to ``size`` (and its
    output's to ``factor * size``): the convolutions and weights are the model's own, the
    image a crop, so that the RTL runs in seconds."""
    model = onnx.load(path)
    for value, n in ((model.graph.input[0], size), (model.graph.output[0], factor * size)):
        for dim in value.type.tensor_type.shape.dim[2:]:
            dim.dim_value = n
    del model.graph.value_info[:]
    return model


def value_params(graph) -> dict:
    """Integer value -> (scale, zero point) from the nodes that write them."""
    params = {}
    for node in graph.nodes:
        if node.op == "Quantize":
            params[node.outputs[0]] = (node.attrs["scale"], node.attrs["zero_point"])
        elif "out_scale" in node.attrs:
            params[node.outputs[0]] = (node.attrs["out_scale"], node.attrs["out_zp"])
    return params


def per_layer_steps(graph, context: dict, names: dict) -> dict:
    """Each accelerator layer run by the golden model on the reference's input (quantized
    with the layer's input parameters: exact, the reference's tensor is on that grid),
    against the reference's output (quantized with the layer's output parameters and clamp,
    where the reference leaves it float before a ReLU and a quantizer): layer -> differences
    in output steps."""
    from hwonnx.golden.ops import GOLDEN_OPS

    params, result = value_params(graph), {}
    for node in graph.nodes:
        x, y = node.inputs[0], node.outputs[0]
        if node.op not in GOLDEN_OPS or x not in names or y not in names or y not in params:
            continue
        (s_x, z_x), (s_y, z_y) = params[x], params[y]
        q_x = np.rint(context[names[x]] / s_x).astype(np.int64) + z_x
        if np.abs((q_x - z_x) * s_x - context[names[x]]).max() > 1e-4 * s_x:
            continue                 # the reference's input is not on the layer's input grid
        args = [q_x.astype(np.int8)] + [graph.constants[v] for v in node.inputs[1:]]
        got = GOLDEN_OPS[node.op](*args, **dict(node.attrs)).astype(np.int64)
        want = np.clip(np.rint(context[names[y]] / s_y).astype(np.int64) + z_y,
                       node.attrs.get("lo", -128), node.attrs.get("hi", 127))
        result[node.name] = got.reshape(want.shape) - want
    return result


def test_espcn_nn_resize_shipped_model():
    """Brevitas' ESPCN (8-bit input and output, 4-bit hidden activations and weights, per
    channel, float biases, BatchNormalization between each Conv and its quantizer, nearest
    Resize), on an 8x8 crop of its test image: every layer within one step of qonnx's
    executor given the same input; end to end the differences compound (4-bit inputs to an
    8-bit layer turn one step into several of the finer output), reported; the RTL equal to
    golden in the predicted cycles."""
    model = cropped(DATA / "bsd300x3-espcn" / "nn_resize" / "quant_model.onnx", 8, 2)
    image = numpy_helper.to_array(onnx.load_tensor(
        str(DATA / "bsd300x3-espcn" / "test_data" / "input_0.pb")))
    xs = np.stack([image[0, :, :8, :8], image[0, :, 40:48, 60:68]])
    wrapper = ModelWrapper(model).transform(InferShapes())
    name = wrapper.graph.input[0].name
    contexts = [execute_onnx(wrapper, {name: x[None]}, return_full_exec_context=True)
                for x in xs]
    want = np.concatenate([c["96"] for c in contexts])
    result = api.build(model, None, calib=None, config=ESPCN_CONFIG, verilog=False,
                       log=lambda *_: None)
    names = {"onnx::Relu_0:q": "x", "input.3:q": "x.7", "input.11:q": "x.15",
             "input.19:q": "onnx::Resize_80", "x.23:q": "x.23", "96:q": "96"}
    for context in contexts:
        layers = per_layer_steps(result.graph, context, names)
        assert sorted(layers) == ["Conv_10", "Conv_22", "Conv_34", "Conv_48", "Resize_42"]
        for layer, diff in layers.items():
            print(f"{layer}: {np.count_nonzero(diff)} of {diff.size} differ from qonnx given "
                  f"its input, at most {np.abs(diff).max()} step")
            assert np.abs(diff).max() <= 1
    # (not rtl_matches_golden: its layer-by-layer check truncates the program after the
    # first output phase of the Resize, whose other phases have not yet written their pixels)
    rtl = api.simulate(result, {name: xs}, mode="compare", log=lambda *_: None)
    np.testing.assert_array_equal(rtl.int_outputs, api.simulate(
        result, {name: xs}, mode="golden").int_outputs)
    assert rtl.cycles == [rtl.predicted_cycles] * len(xs)
    diff = steps(rtl.outputs["96"], want, 0.003921568859368563)
    print(f"ESPCN end to end: {np.count_nonzero(diff)} of {diff.size} outputs differ from "
          f"qonnx's executor, at most {np.abs(diff).max()} steps")
    assert np.abs(diff).max() <= 3


def _shipped(rel: str, size: "int | None"):
    model = onnx.load(DATA / rel) if size is None else cropped(DATA / rel, size)
    if size is not None:                          # the output's size: inferred from the crop
        for dim in model.graph.output[0].type.tensor_type.shape.dim[2:]:
            dim.dim_param = "s"
    return model


@pytest.mark.rtl
def test_eltwise_chanlast_testcase_shipped_model():
    """A float Conv with folded scale and bias, ReLU, a per-channel Mul and an unsigned
    4-bit Quant (scale 1) whose domain the model does not import; the input is annotated
    UINT8, so it is quantized with scale 1, exactly. The float Conv is calibrated:
    within one output step of qonnx's executor; RTL equal to golden."""
    model = _shipped("eltwise_chanlast_testcase.onnx", 16)
    rng = np.random.default_rng(17)
    xs = rng.integers(0, 256, (16, 3, 16, 16)).astype(np.float32)
    result = api.build(model, None, calib={"global_in": xs}, config=ORT_CONFIG,
                       verilog=False, log=lambda *_: None)
    assert any("'qonnx.custom_op.general', which the model's opset_import does not import"
               in w for w in result.graph.meta["warnings"])
    first = next(n for n in result.graph.nodes if n.op == "Quantize")   # UINT8: exact
    assert (first.attrs["scale"], first.attrs["zero_point"]) == (1.0, -128)
    layer = next(n for n in result.graph.nodes if n.name == "Mul_30")
    assert (layer.attrs["lo"], layer.attrs["hi"]) == (0, 15)
    rtl = rtl_matches_golden(result, {"global_in": xs[:4]}, 4)
    want = reference(model, xs[:4])
    diff = steps(rtl.outputs["Mul_31_out0"], want, 1.0)
    print(f"eltwise_chanlast: {np.count_nonzero(diff)} of {diff.size} outputs differ from "
          f"qonnx's executor (the float Conv is calibrated), at most {np.abs(diff).max()}")
    assert np.abs(diff).max() <= 1 and want.max() == 15


@pytest.mark.rtl
@pytest.mark.parametrize("rel, size", [("mnist-conv/model.onnx", None),
                                       ("residual_block_clean.onnx", 40)])
def test_float_shipped_models(rel, size):
    """The wheel's float models (mnist-conv: Conv/Add bias/Relu/MaxPool/MatMul with its
    parameters as graph inputs, IR 3; residual_block_clean: strided Conv, residual Add,
    MaxPool, on a 40x40 crop), quantized by hwonnx with calibration: the RTL equal to golden;
    golden against qonnx's executor within the calibrated quantization's error (reported)."""
    model = _shipped(rel, size)
    rng = np.random.default_rng(18)
    name = model.graph.input[0].name
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    if rel.startswith("mnist"):
        image = numpy_helper.to_array(onnx.load_tensor(
            str(DATA / "mnist-conv" / "test_data_set_0" / "input_0.pb")))
        xs = np.clip(image + rng.normal(0, 30, (16, *shape[1:])), 0, 255).astype(np.float32)
        xs[0] = image[0]
    else:
        xs = rng.uniform(0, 1, (16, *shape[1:])).astype(np.float32)
    result = api.build(model, None, calib={name: xs}, config=ArchConfig(), verilog=False,
                       log=lambda *_: None)
    rtl = rtl_matches_golden(result, {name: xs[:4]}, 4)
    want = reference(model, xs[:4])
    got = list(rtl.outputs.values())[0].reshape(want.shape)
    error = float(np.abs(got - want).max() / np.ptp(want))
    print(f"{rel}: largest difference from qonnx's executor {error:.1%} of the output range")
    assert error < 0.06
    if rel.startswith("mnist"):
        expected = numpy_helper.to_array(onnx.load_tensor(
            str(DATA / "mnist-conv" / "test_data_set_0" / "output_0.pb")))
        assert got[0].argmax() == expected.argmax()


def test_espcn_subpixel_shipped_model():
    """ESPCN with DepthToSpace (pixel shuffle, a copy on the array) and no input quantizer
    (the input is calibrated: on a ramp of k/255, the test image's grid, so its quantization
    is exact): every layer within one step of qonnx given its input; end to end reported."""
    model = cropped(DATA / "bsd300x3-espcn" / "subpixel" / "quant_model.onnx", 8, 2)
    image = numpy_helper.to_array(onnx.load_tensor(
        str(DATA / "bsd300x3-espcn" / "test_data" / "input_0.pb")))
    xs = np.stack([image[0, :, :8, :8], image[0, :, 40:48, 60:68]])
    name = model.graph.input[0].name
    wrapper = ModelWrapper(model).transform(InferShapes())
    contexts = [execute_onnx(wrapper, {name: x[None]}, return_full_exec_context=True)
                for x in xs]
    want = np.concatenate([c["79"] for c in contexts])
    ramp = (np.arange(3 * 8 * 8) % 256).reshape(1, 3, 8, 8).astype(np.float32) / 255
    ramp.flat[-1] = 1.0
    result = api.build(model, None, calib={name: np.concatenate([xs, ramp])},
                       config=ESPCN_CONFIG, verilog=False, log=lambda *_: None)
    assert [n.op for n in result.graph.nodes].count("QConvTranspose") == 1   # DepthToSpace
    names = {"x.7:q": "x.7", "input.3:q": "x.3", "input.11:q": "x.12", "input.19:q": "x.20",
             "onnx::DepthToSpace_73:q": "onnx::DepthToSpace_73", "79:q": "79"}
    seen = set()
    for context in contexts:
        for layer, diff in per_layer_steps(result.graph, context, names).items():
            seen.add(layer)
            print(f"{layer}: {np.count_nonzero(diff)} of {diff.size} differ from qonnx given "
                  f"its input, at most {np.abs(diff).max()} step")
            assert np.abs(diff).max() <= 1
    assert seen == {"Conv_5", "Conv_17", "Conv_29", "Conv_41"}
    rtl = api.simulate(result, {name: xs}, mode="compare", log=lambda *_: None)
    assert rtl.cycles == [rtl.predicted_cycles] * len(xs)
    diff = steps(rtl.outputs["79"], want, 0.003921568859368563)
    print(f"ESPCN subpixel end to end: {np.count_nonzero(diff)} of {diff.size} outputs differ "
          f"from qonnx's executor, at most {np.abs(diff).max()} steps")
    assert np.abs(diff).max() <= 8
