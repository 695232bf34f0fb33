"""1-D models ([N, C, L]: audio, time series) as 2-D ones of height 1 (hwonnx/frontend/onedim.py):
the float graph against onnxruntime, the golden model against the same network written in
2-D by hand (bit for bit) and, quantized by onnxruntime (QDQ), against its reference path
(within 1 LSB); on the RTL bit-exact with the predicted cycles; the unsupported 1-D forms in
one error."""

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_static)

from hwonnx import api
from hwonnx.config import ArchConfig
from hwonnx.errors import UnsupportedOperatorError
from hwonnx.frontend import load_model
from hwonnx.ir.evaluate import evaluate_float
from spec_helpers import make_model
from ort_reference import reference_outputs

ort.set_default_logger_severity(3)
C, L = 3, 32


def _model(nodes, inits, in_shape, out_shape):
    return make_model(nodes, {"x": in_shape}, {"y": out_shape},
                      {k: np.asarray(v, np.float32) for k, v in inits.items()}, opset=13)


def _inits(seed):
    rng = np.random.default_rng(seed)

    def w(*shape, s=0.3):
        return rng.normal(0, s, shape)
    return {"c1w": w(8, C, 3), "c1b": w(8, s=0.1), "bn_s": rng.uniform(0.5, 1.5, 8),
            "bn_b": w(8, s=0.1), "bn_m": w(8, s=0.1), "bn_v": rng.uniform(0.5, 2, 8),
            "c2w": w(8, 8, 3), "c2b": w(8, s=0.1), "dww": w(8, 1, 3), "dwb": w(8, s=0.1),
            "fw": w(5, 8), "fb": w(5, s=0.1), "pw": w(6, C, 3), "pb": w(6, s=0.1),
            "qw": w(6, 6, 1), "qb": w(6, s=0.1), "scale": rng.uniform(0.5, 1.5, (6, 1))}


def cnn(two_d: bool = False, seed: int = 3):
    """Conv1d k=3 (stride 1) -> BatchNormalization -> Relu -> Conv1d k=3 stride 2 -> Relu ->
    depthwise Conv1d (dilation 2) -> Relu -> MaxPool1d -> GlobalAveragePool -> Flatten ->
    Gemm; with ``two_d`` the same network on [1, C, 1, L] (kernels [1, k], ...)."""
    inits = _inits(seed)
    h = (lambda v: [1, *v]) if two_d else (lambda v: list(v))          # kernels, strides
    p = (lambda a, b: [0, a, 0, b]) if two_d else (lambda a, b: [a, b])   # pads
    if two_d:
        for name in ("c1w", "c2w", "dww"):
            inits[name] = inits[name][:, :, None, :]
    nodes = [
        helper.make_node("Conv", ["x", "c1w", "c1b"], ["c1"], name="conv1",
                         kernel_shape=h([3]), pads=p(1, 1)),
        helper.make_node("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"], ["n1"],
                         name="bn1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "c2w", "c2b"], ["c2"], name="conv2",
                         kernel_shape=h([3]), strides=h([2]), pads=p(1, 0)),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "dww", "dwb"], ["c3"], name="dw", group=8,
                         kernel_shape=h([3]), pads=p(2, 2), dilations=h([2])),
        helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
        helper.make_node("MaxPool", ["r3"], ["mp"], name="pool", kernel_shape=h([2]),
                         strides=h([2])),
        helper.make_node("GlobalAveragePool", ["mp"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], name="fc", transB=1)]
    keep = ("c1w", "c1b", "bn_s", "bn_b", "bn_m", "bn_v", "c2w", "c2b", "dww", "dwb", "fw",
            "fb")
    return _model(nodes, {k: inits[k] for k in keep}, [1, C, 1, L] if two_d else [1, C, L],
                  [1, 5])


def sequence(seed: int = 4):
    """A 1-D model whose output is a sequence [1, 12, L]: Pad (both ends of L) -> Conv1d ->
    Relu -> per-channel Mul -> 1x1 Conv1d -> residual Add -> Relu -> Concat with the Mul's
    output along the channels."""
    inits = _inits(seed)
    pads = np.array([0, 0, 2, 0, 0, 0], np.int64)
    nodes = [helper.make_node("Pad", ["x", "pads"], ["xp"], name="pad"),
             helper.make_node("Conv", ["xp", "pw", "pb"], ["a"], name="conva",
                              kernel_shape=[3]),
             helper.make_node("Relu", ["a"], ["ar"], name="relua"),
             helper.make_node("Mul", ["ar", "scale"], ["s"], name="mul"),
             helper.make_node("Conv", ["s", "qw", "qb"], ["b"], name="convb"),
             helper.make_node("Add", ["s", "b"], ["sum"], name="add"),
             helper.make_node("Relu", ["sum"], ["sr"], name="relus"),
             helper.make_node("Concat", ["sr", "s"], ["y"], name="cat", axis=1)]
    model = _model(nodes, {k: inits[k] for k in ("pw", "pb", "qw", "qb", "scale")},
                   [1, C, L], [1, 12, L])
    model.graph.initializer.append(numpy_helper.from_array(pads, "pads"))
    return model


def forms(kind: str):
    """Smaller 1-D models of other forms: a host normalization before a Conv1d with
    auto_pad SAME_UPPER and stride 2 and a LeakyRelu (a table) writing the output;
    AveragePool1d with count_include_pad=0 and padding, then GlobalMaxPool; a channels-last
    input [1, L, C] transposed on the host."""
    rng = np.random.default_rng(12)
    conv = {"w": rng.normal(0, 0.3, (4, C, 3)), "b": rng.normal(0, 0.1, 4)}
    if kind == "normalized":
        nodes = [helper.make_node("Sub", ["x", "mean"], ["s"], name="sub"),
                 helper.make_node("Div", ["s", "std"], ["d"], name="div"),
                 helper.make_node("Conv", ["d", "w", "b"], ["c"], name="conv",
                                  kernel_shape=[3], auto_pad="SAME_UPPER", strides=[2]),
                 helper.make_node("LeakyRelu", ["c"], ["y"], name="leaky", alpha=0.1)]
        return _model(nodes, {**conv, "mean": rng.normal(0, 1, (C, 1)),
                              "std": rng.uniform(1, 2, (C, 1))}, [1, C, L], [1, 4, L // 2])
    if kind == "average":
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3]),
                 helper.make_node("AveragePool", ["c"], ["a"], name="avg", kernel_shape=[3],
                                  pads=[1, 1], strides=[2], count_include_pad=0),
                 helper.make_node("GlobalMaxPool", ["a"], ["y"], name="gmp")]
        return _model(nodes, conv, [1, C, L], [1, 4, 1])
    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="nlc", perm=[0, 2, 1]),
             helper.make_node("Conv", ["t", "w", "b"], ["c"], name="conv", kernel_shape=[3]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return _model(nodes, conv, [1, L, C], [1, 4, L - 2])


@pytest.mark.parametrize("kind", ["normalized", "average", "channels_last"])
def test_other_1d_forms(kind):
    """The float graph equals onnxruntime's (the 1-D view changes no value), and the model
    builds: the golden model's output has the model's shape and is within 3 output steps of
    onnxruntime on the float model (input and weight rounding through one 9-tap convolution,
    about 2 steps here, and the output's own rounding)."""
    model = forms(kind)
    shape = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    x = _samples(shape=shape[1:])
    graph = load_model(model)
    want = _ort(model, x)
    np.testing.assert_allclose(evaluate_float(graph, {"x": x})["y"], want, rtol=1e-4,
                               atol=1e-5)
    result = api.build(model, None, calib={"x": x}, config=ArchConfig(), verilog=False,
                       log=lambda *_: None)
    golden = api.simulate(result, {"x": x}, mode="golden").outputs["y"]
    assert golden.shape == (len(x), *want.shape[1:])
    step = next(n for n in result.graph.nodes if n.op == "Dequantize").attrs["scale"]
    print(f"{kind}: golden within {np.abs(golden - want).max() / step:.2f} output steps")
    assert np.abs(golden - want).max() <= 3 * step


def _samples(seed=9, count=16, shape=(C, L)):
    return np.random.default_rng(seed).normal(0, 1, (count, *shape)).astype(np.float32)


def _ort(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"x": sample[None]})[0] for sample in x])


@pytest.mark.parametrize("make", [cnn, sequence])
def test_float_graph_matches_onnxruntime(make):
    model = make()
    graph = load_model(model)
    assert graph.types["x"].shape == (1, C, L)                     # the model's own shapes
    assert graph.types["y"].shape == tuple(d.dim_value for d in
                                           model.graph.output[0].type.tensor_type.shape.dim)
    x = _samples()
    got = evaluate_float(graph, {"x": x})["y"]
    np.testing.assert_allclose(got.reshape(len(x), -1), _ort(model, x).reshape(len(x), -1),
                               rtol=1e-4, atol=1e-5)
    views = [n for n in graph.nodes if n.op == "Reshape" and n.inputs == ("x",)]
    assert [graph.types[v.outputs[0]].shape for v in views] == [(1, C, 1, L)]
    assert graph.meta["host_steps"][views[0].name]["at"] == "start"
    assert all(len(graph.types[n.inputs[0]].shape) == 4 for n in graph.nodes
               if n.op in ("Conv", "MaxPool", "AvgPool"))


def test_golden_equals_the_2d_network():
    """The 1-D CNN and the same network written in 2-D (height 1) by hand, calibrated on
    the same samples: the same integer graph, so the same int8 outputs, bit for bit."""
    x = _samples()
    one = api.build(cnn(), None, calib={"x": x}, config=ArchConfig(), verilog=False,
                    log=lambda *_: None)
    two = api.build(cnn(two_d=True), None, calib={"x": x[:, :, None]}, config=ArchConfig(),
                    verilog=False, log=lambda *_: None)
    got = api.simulate(one, {"x": x}, mode="golden")
    want = api.simulate(two, {"x": x[:, :, None]}, mode="golden")
    np.testing.assert_array_equal(got.int_outputs, want.int_outputs)
    assert got.outputs["y"].shape == (len(x), 5)
    assert got.predicted_cycles == want.predicted_cycles


class _Reader(CalibrationDataReader):
    def __init__(self, x):
        self.data = iter([{"x": sample[None]} for sample in x])

    def get_next(self):
        return next(self.data, None)


def _quantized(tmp_path, make, fmt, two_d=False):
    path, quantized = tmp_path / "float.onnx", tmp_path / f"{fmt}.onnx"
    onnx.save(make(two_d=True) if two_d else make(), path)
    samples = _samples(5, 32)
    quantize_static(str(path), str(quantized), _Reader(samples[:, :, None] if two_d else samples),
                    quant_format=getattr(QuantFormat, fmt), per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    return onnx.load(quantized)


def _lsb(model, y, x):
    """|y - the reference output of ``model`` on ``x``| in steps of its output scale."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    last = [n for n in model.graph.node if n.op_type == "DequantizeLinear"][-1]
    y_ref = reference_outputs(model, {"x": x})[0].reshape(len(x), -1)
    return np.abs(y.reshape(len(x), -1) - y_ref) / float(inits[last.input[1]])


@pytest.mark.parametrize("make, fmt", [(cnn, "QDQ"), (sequence, "QDQ"), (cnn, "QOperator")])
def test_quantized_model_matches_the_reference(tmp_path, make, fmt):
    """onnxruntime's per-channel quantization of the 1-D model (QDQ; QOperator, whose
    operators hwonnx maps), built with its own parameters: within 1 LSB of the output scale
    of the reference (``ort_reference``: onnxruntime's reference path for QDQ, the exact
    integer operators for QOperator, whose 1-D form here equals, bit for bit, its 2-D form
    on the network written in 2-D, which tests/golden/test_ort_reference.py checks)."""
    model = _quantized(tmp_path, make, fmt)
    result = api.build(model, None, calib=None, config=ArchConfig(), verilog=False,
                       log=lambda *_: None)
    x = _samples(11, 32)
    golden = api.simulate(result, {"x": x}, mode="golden").outputs["y"]
    lsb = _lsb(model, golden, x)
    print(f"{make.__name__} {fmt} vs its reference: {np.count_nonzero(lsb > 0.5)} of "
          f"{lsb.size} values differ, largest {lsb.max():.2f} LSB")
    assert lsb.max() <= 1 + 1e-3
    if fmt == "QOperator":
        twin = _quantized(tmp_path, make, fmt, two_d=True)
        np.testing.assert_array_equal(reference_outputs(model, {"x": x})[0],
                                      reference_outputs(twin, {"x": x[:, :, None]})[0])


@pytest.mark.rtl
@pytest.mark.parametrize("make", [cnn, sequence])
def test_1d_model_on_rtl(make):
    """On the 8x8 RTL: samples [S, C, L] in, the model's output shape out, bit-exact with
    golden, cycles as predicted."""
    x = _samples()
    result = api.build(make(), None, calib={"x": x}, config=ArchConfig(), verilog=False,
                       log=lambda *_: None)
    golden = api.simulate(result, {"x": x}, mode="golden")
    rtl = api.simulate(result, {"x": x}, mode="rtl", log=lambda *_: None)
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [golden.predicted_cycles] * len(x)
    dims = [d.dim_value for d in make().graph.output[0].type.tensor_type.shape.dim]
    assert rtl.outputs["y"].shape == (len(x), *dims[1:])


def test_unsupported_1d_nodes_are_listed_together():
    """Two 1-D pooling nodes hwonnx cannot map (ceil_mode=1, a dilated average pooling) and
    a 3-D convolution: one error naming all three."""
    nodes = [helper.make_node("MaxPool", ["x"], ["a"], name="mp", kernel_shape=[2],
                              strides=[2], ceil_mode=1),
             helper.make_node("AveragePool", ["a"], ["b"], name="ap", kernel_shape=[2],
                              dilations=[2]),
             helper.make_node("Unsqueeze", ["b", "axes"], ["c"], name="unsq"),
             helper.make_node("Conv", ["c", "w"], ["y"], name="conv3d")]
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 9])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1, 3, 1, 1])],
        [numpy_helper.from_array(np.array([3, 4], np.int64), "axes"),
         numpy_helper.from_array(np.ones((1, 2, 1, 1, 1), np.float32), "w")])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 19)])
    message = ("3 unsupported node(s): node 'mp' MaxPool (domain 'ai.onnx', opset 19); node "
               "'ap' AveragePool (domain 'ai.onnx', opset 19); node 'conv3d' Conv (domain "
               "'ai.onnx', opset 19) (MaxPool 'mp' is a 1-D pooling with ceil_mode=1; only "
               "ceil_mode=0 (output size rounded down) is supported; AveragePool 'ap' is a "
               "1-D pooling with dilations [2]; only dilations [1] are supported; Conv "
               "'conv3d' reads 'c' of shape [1, 2, 3, 1, 1]: only a 1-D ([N, C, L]) or 2-D "
               "([N, C, H, W]) convolution maps to the array, not 3-D)")
    with pytest.raises(UnsupportedOperatorError, match="^" + re.escape(message) + "$"):
        load_model(model)
