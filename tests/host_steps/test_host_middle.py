"""Which operators the host runs between accelerator segments (tests/host_steps/test_segments.py
has the segments themselves): an ArgMax or TopK whose result feeds on, host steps at the start, in
the middle and at the end of a two-input model, a QDQ model with a Softmax in the middle, a host
result constant on the calibration data, a Mul by a constant the array cannot scale by; and what
neither side runs, still refused by name."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hwonnx.api import build, simulate
from hwonnx.compiler.timing import predict
from hwonnx.errors import UnsupportedOperatorError

from ort_reference import reference_outputs
from rtl_helpers import he_weight
from helpers import quiet
from host_steps_helpers import conv_node, onnx_model, scale_of, softmax_middle


def test_what_neither_side_runs_is_still_refused():
    """Nodes that read the int64 indices of an ArgMax between segments and are neither a Cast
    nor a layout node (the accelerator reads float values only; the host has no Relu) are
    refused by name, all in one error; an operator hwonnx does not know is refused by name.
    The ArgMax itself, the Flatten of its indices and a Cast to float are host steps."""
    from hwonnx.frontend import load_model

    rng = np.random.default_rng(0)
    nodes = [conv_node("conv", "x", "w", "c"),
             helper.make_node("ArgMax", ["c"], ["i"], name="argmax", axis=1),
             helper.make_node("Flatten", ["i"], ["fi"], name="flat"),
             helper.make_node("Relu", ["fi"], ["r"], name="relu"),
             helper.make_node("ArgMax", ["c"], ["j"], name="argmax2", axis=2),
             helper.make_node("Relu", ["j"], ["rj"], name="relu2"),
             helper.make_node("Cast", ["r"], ["y"], name="tofloat", to=TensorProto.FLOAT),
             helper.make_node("Cast", ["rj"], ["z"], name="tofloat2", to=TensorProto.FLOAT)]
    model = onnx_model(nodes, {"w": he_weight(rng, 4, 3, 1, 1)}, {"x": [1, 3, 4, 4]},
                       {"y": [1, 16], "z": [1, 4, 1, 4]})
    model.opset_import[0].version = 14              # Relu of int64
    with pytest.raises(UnsupportedOperatorError) as error:
        load_model(model)
    assert str(error.value) == (
        "2 unsupported node(s): node 'relu' Relu (domain 'ai.onnx', opset 14); node 'relu2' "
        "Relu (domain 'ai.onnx', opset 14) (Relu 'relu' runs on neither: it reads the int64 "
        "indices 'fi' of ArgMax 'argmax', but the accelerator reads only float values (a Cast "
        "to float before it would do) and the host runs only Cast and layout nodes on "
        "indices; Relu 'relu2' runs on neither: it reads the int64 indices 'j' of ArgMax "
        "'argmax2', but the accelerator reads only float values (a Cast to float before it "
        "would do) and the host runs only Cast and layout nodes on indices)")
    nodes = [conv_node("conv", "x", "w", "c"), helper.make_node("Hardmax", ["c"], ["h"], name="hm",
                                                                axis=1),
             conv_node("conv2", "h", "w2", "y")]
    model = onnx_model(nodes, {"w": he_weight(rng, 4, 3, 1, 1), "w2": he_weight(rng, 2, 4, 1, 1)},
                       {"x": [1, 3, 4, 4]}, {"y": [1, 2, 4, 4]})
    with pytest.raises(UnsupportedOperatorError, match=r"^1 unsupported node\(s\): node 'hm' "
                                                       r"Hardmax"):
        load_model(model)


def argmax_feeds_on(rng):
    """The index of the largest of 6 channels at each pixel (ArgMax, int64), cast to float,
    through a 1x1 Conv."""
    nodes = [conv_node("conv1", "x", "w1", "c1", pads=[1] * 4),
             helper.make_node("ArgMax", ["c1"], ["i"], name="argmax", axis=1),
             helper.make_node("Cast", ["i"], ["f"], name="tofloat", to=TensorProto.FLOAT),
             conv_node("conv2", "f", "w2", "y")]
    return onnx_model(nodes, {"w1": he_weight(rng, 6, 3, 3, 3), "w2": he_weight(rng, 2, 1, 1, 1)},
                      {"x": [1, 3, 5, 5]}, {"y": [1, 2, 5, 5]})


def topk_feeds_on(rng):
    """The 3 largest of 6 Gemm outputs (TopK values) through a second Gemm; the indices are
    a graph output."""
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("TopK", ["h", "k"], ["v", "idx"], name="topk", axis=1),
             helper.make_node("Gemm", ["v", "w2"], ["y"], name="fc2")]
    inits = {"w1": he_weight(rng, 6, 8).T.copy(), "w2": he_weight(rng, 2, 3).T.copy()}
    model = onnx_model(nodes, inits, {"x": [1, 8]}, {"y": [1, 2]},
                       [helper.make_tensor_value_info("idx", TensorProto.INT64, [1, 3])])
    model.graph.initializer.append(numpy_helper.from_array(np.array([3], np.int64), "k"))
    return model


@pytest.mark.rtl
@pytest.mark.parametrize("maker", [argmax_feeds_on, topk_feeds_on])
def test_argmax_and_topk_feeding_on(maker, tmp_path):
    """An ArgMax (then a Cast to float) and a TopK whose values feed further layers: host
    steps between two segments, each equal to onnxruntime's reference path on the golden
    model's own inputs of the step (exactly: indices, values, the Cast), and the RTL equal to
    golden in each segment's predicted cycles."""
    from hwonnx.golden import evaluate

    rng = np.random.default_rng(6)
    model = maker(rng)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    calib = {"x": rng.uniform(-1, 1, (32, *shape[1:])).astype(np.float32)}
    result = build(model, tmp_path / "out", calib=calib, log=quiet, verilog=False)
    assert len(result.segments) == 2
    graph = result.graph
    env = evaluate(graph, {"x": calib["x"].reshape((-1,) + graph.types["x"].shape[1:])},
                   keep_all=True)
    steps = [n for n in graph.nodes if graph.meta["host_steps"].get(n.name, {}).get("at")
             == "middle"]
    assert [n.op for n in steps] in (["ArgMax", "Cast"], ["TopK"])
    for node in steps:
        onnx_node = onnx.ModelProto()
        onnx_node.CopyFrom(model)
        del onnx_node.graph.node[:]
        source = next(n for n in model.graph.node if n.name == node.name)
        onnx_node.graph.node.append(source)
        del onnx_node.graph.input[:], onnx_node.graph.output[:]
        onnx_node.graph.input.append(helper.make_tensor_value_info(
            source.input[0], TensorProto.INT64 if node.op == "Cast" else TensorProto.FLOAT,
            list(graph.types[source.input[0]].shape)))
        for out in source.output:
            onnx_node.graph.output.append(helper.make_tensor_value_info(
                out, helper.np_dtype_to_tensor_dtype(env[out].dtype), None))
        want = reference_outputs(onnx_node, {source.input[0]: env[source.input[0]]})
        for out, array in zip(source.output, want):
            np.testing.assert_array_equal(env[out], array)
    few = {"x": calib["x"][:4]}
    rtl = simulate(result, few, mode="compare", log=quiet)
    predicted = [predict(p.expanded(), p.config).total for p in result.segments]
    assert rtl.segment_cycles == [[p] * 4 for p in predicted]


def two_inputs_around(rng):
    """Host steps at the start, in the middle and at the end, two inputs: ``x`` [1, 3, 6, 6]
    normalized on the host (x - 0.5), Conv, Softmax over channels, 1x1 Conv; ``z``
    [1, 2, 6, 6] through its own 1x1 Conv in segment 1 (its result crosses the boundary),
    added to segment 2's Conv; an ArgMax over channels at the end (int64)."""
    inits = {"mean": np.float32(0.5), "w1": he_weight(rng, 4, 3, 3, 3),
             "wz": he_weight(rng, 4, 2, 1, 1), "w2": he_weight(rng, 4, 4, 1, 1, gain=4.0)}
    nodes = [helper.make_node("Sub", ["x", "mean"], ["xn"], name="norm"),
             conv_node("conv1", "xn", "w1", "c1", pads=[1] * 4),
             helper.make_node("Softmax", ["c1"], ["s"], name="softmax", axis=1),
             conv_node("convz", "z", "wz", "cz"),
             conv_node("conv2", "s", "w2", "c2"),
             helper.make_node("Add", ["c2", "cz"], ["y"], name="add"),
             helper.make_node("ArgMax", ["y"], ["cls"], name="argmax", axis=1)]
    return onnx_model(nodes, inits, {"x": [1, 3, 6, 6], "z": [1, 2, 6, 6]}, {"y": [1, 4, 6, 6]},
                      [helper.make_tensor_value_info("cls", TensorProto.INT64, [1, 1, 6, 6])])


@pytest.mark.rtl
def test_start_middle_and_end_host_steps_with_two_inputs(tmp_path):
    """The prefix (x - 0.5), the Softmax between segments and the final ArgMax around two
    segments of two inputs: the golden model within 3 LSB of onnxruntime's reference path on
    ``y`` (calibration data), its ArgMax the first index of the largest golden ``y`` (NumPy),
    the RTL equal to golden in each segment's predicted cycles; ``cz`` (made from ``z`` in
    segment 1) is written again into segment 2."""
    rng = np.random.default_rng(5)
    model = two_inputs_around(rng)
    calib = {"x": rng.uniform(0, 1, (32, 3, 6, 6)).astype(np.float32),
             "z": rng.uniform(-1, 1, (32, 2, 6, 6)).astype(np.float32)}
    result = build(model, tmp_path / "out", calib=calib, log=quiet, verilog=False)
    assert [[p.value for p in s.inputs] for s in result.segments] == [["xn:q", "z:q"],
                                                                      ["s:q", "cz:q"]]
    assert result.graph.meta["host_steps"]["norm"]["at"] == "start"
    assert result.graph.meta["host_steps"]["argmax"]["at"] == "end"
    golden = simulate(result, calib, mode="golden")
    want_y, _ = reference_outputs(model, calib)
    lsb = np.abs(golden.outputs["y"] - want_y) / scale_of(result.graph, "y")
    assert lsb.max() <= 3 and lsb.mean() < 0.6, (lsb.max(), lsb.mean())
    np.testing.assert_array_equal(golden.outputs["cls"],
                                  np.argmax(golden.outputs["y"], axis=1)[:, None])
    few = {k: v[:4] for k, v in calib.items()}
    rtl = simulate(result, few, mode="compare", log=quiet)
    predicted = [predict(p.expanded(), p.config).total for p in result.segments]
    assert rtl.segment_cycles == [[p] * 4 for p in predicted]
    np.testing.assert_array_equal(rtl.outputs["cls"], golden.outputs["cls"][:4])


def test_a_qdq_model_with_a_softmax_in_the_middle_equals_onnxruntime(tmp_path):
    """softmax_middle quantized by onnxruntime (quantize_static, QDQ, int8): compiled with
    its own parameters and no calibration data into two segments (the Softmax's output
    QuantizeLinear gives the host result's parameters), on an architecture that rounds as
    onnxruntime does, the golden model equals onnxruntime's reference path on the QDQ model
    exactly."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    from hwonnx.config import ArchConfig

    rng = np.random.default_rng(0)
    onnx.save(softmax_middle(rng), tmp_path / "float.onnx")
    calib = rng.uniform(-1, 1, (32, 3, 8, 8)).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = iter([{"x": c[None]} for c in calib])

        def get_next(self):
            return next(self.samples, None)

    quantize_static(str(tmp_path / "float.onnx"), str(tmp_path / "qdq.onnx"), Reader(),
                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8)
    result = build(tmp_path / "qdq.onnx", tmp_path / "out", calib=None, log=quiet,
                   verilog=False, config=ArchConfig(ort_rounding=True))
    assert len(result.segments) == 2
    golden = simulate(result, calib, mode="golden")
    [want] = reference_outputs(tmp_path / "qdq.onnx", {"x": calib})
    np.testing.assert_array_equal(golden.outputs["y"], want)


def test_a_host_result_constant_on_the_calibration_data_is_quantized(tmp_path):
    """A Softmax over one channel is 1 everywhere: the host result still gets the parameters
    of its range [0, 1] (a graph input constant on the calibration data is refused, a host
    result is not the user's to vary), and the golden output equals onnxruntime's reference
    path within 3 LSB (the second Conv sees an exact 1: 255 steps of 1/255)."""
    rng = np.random.default_rng(3)
    nodes = [conv_node("conv1", "x", "w1", "c1", pads=[1] * 4),
             helper.make_node("Softmax", ["c1"], ["s"], name="softmax", axis=1),
             helper.make_node("Mul", ["s", "c1"], ["m"], name="gate"),
             conv_node("conv2", "m", "w2", "y")]
    model = onnx_model(nodes, {"w1": he_weight(rng, 1, 3, 3, 3), "w2": he_weight(rng, 2, 1, 1, 1)},
                       {"x": [1, 3, 5, 5]}, {"y": [1, 2, 5, 5]})
    calib = rng.uniform(-1, 1, (32, 3, 5, 5)).astype(np.float32)
    result = build(model, tmp_path / "out", calib={"x": calib}, log=quiet, verilog=False)
    [node] = [n for n in result.graph.nodes if n.op == "Quantize" and n.inputs[0] == "s"]
    assert (node.attrs["scale"], node.attrs["zero_point"]) == (pytest.approx(1 / 255), -128)
    golden = simulate(result, {"x": calib}, mode="golden")
    [want] = reference_outputs(model, {"x": calib})
    lsb = np.abs(golden.outputs["y"] - want) / scale_of(result.graph, "y")
    assert lsb.max() <= 3, lsb.max()


def test_a_mul_by_a_constant_the_array_cannot_scale_by_is_a_host_step(tmp_path):
    """A Mul by a [1, C, H, W] constant (neither a scalar nor per channel) between two
    convolutions: a host step, the golden model within 3 LSB of onnxruntime's reference path
    on the calibration data."""
    rng = np.random.default_rng(4)
    inits = {"w1": he_weight(rng, 4, 3, 3, 3),
             "pos": rng.uniform(0.5, 1.5, (1, 4, 5, 5)).astype(np.float32),
             "w2": he_weight(rng, 2, 4, 1, 1)}
    nodes = [conv_node("conv1", "x", "w1", "c1", pads=[1] * 4),
             helper.make_node("Mul", ["c1", "pos"], ["m"], name="scale"),
             conv_node("conv2", "m", "w2", "y")]
    model = onnx_model(nodes, inits, {"x": [1, 3, 5, 5]}, {"y": [1, 2, 5, 5]})
    calib = {"x": rng.uniform(-1, 1, (32, 3, 5, 5)).astype(np.float32)}
    result = build(model, tmp_path / "out", calib=calib, log=quiet, verilog=False)
    assert len(result.segments) == 2
    assert result.graph.meta["host_steps"]["scale"]["at"] == "middle"
    golden = simulate(result, calib, mode="golden")
    [want] = reference_outputs(model, calib)
    lsb = np.abs(golden.outputs["y"] - want) / scale_of(result.graph, "y")
    assert lsb.max() <= 3 and lsb.mean() < 0.6, (lsb.max(), lsb.mean())
