"""Models already quantized by onnxruntime (QDQ and QOperator): imported with their own
quantization parameters, compiled without calibration data, and compared with onnxruntime
running the same quantized model (int8 outputs, LSB of the output scale, top-1)."""


import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantFormat, quantize_static

from hwonnx import api
from hwonnx.config import ArchConfig
from hwonnx.errors import ModelError, QuantizationError
from hwonnx.frontend import load_model
from hwonnx.golden import quantize
from hwonnx.quant import add_weights, evaluate_onnxruntime

from helpers import raises
from prequantized_helpers import (SAMPLES, Reader, dims, float_model, onnx_model,
                                  onnxruntime_outputs, quantized)

F = TensorProto.FLOAT


def compare(path, seed=11, config=None, samples=SAMPLES, reference=None):
    """Build ``path`` without calibration data and compare the golden model with the
    reference (see ``ort_reference``) of the same quantized model, or of the model at
    ``reference`` (same quantization parameters in another form): (int8 values differing,
    largest difference in LSB of the output scale, top-1 agreement, int8 values differing
    from :func:`evaluate_onnxruntime`)."""
    result = api.build(path, None, calib=None, config=config, verilog=False,
                       log=lambda *_: None)
    x = np.random.default_rng(seed).normal(0, 1, (samples, *dims(path)[1:])).astype(
        np.float32)
    sim = api.simulate(result, {"x": x}, mode="golden")
    y_ort, q_ort, scale = onnxruntime_outputs(reference or path, x)
    y = sim.outputs["y"].reshape(y_ort.shape)
    q = sim.int_outputs.reshape(q_ort.shape).astype(np.int64)
    max_lsb = int(np.rint(np.abs(y - y_ort) / scale).max())
    top1 = float(np.mean(y.argmax(axis=1) == y_ort.argmax(axis=1)))
    quant = next(n for n in result.graph.nodes if n.op == "Quantize")
    env = evaluate_onnxruntime(result.graph, {quant.outputs[0]: quantize(x, **quant.attrs)})
    emulated = env[result.program.output_value].reshape(q_ort.shape).astype(np.int64)
    return int(np.count_nonzero(q != q_ort)), max_lsb, top1, \
        int(np.count_nonzero(emulated != q_ort))


def optimized_difference(path, seed=11) -> str:
    """How far onnxruntime's default session (its CPU-dependent optimized kernels) is from
    the reference on this machine: reported, never asserted."""
    x = np.random.default_rng(seed).normal(0, 1, (SAMPLES, *dims(path)[1:])).astype(
        np.float32)
    _, q_ref, _ = onnxruntime_outputs(path, x)
    _, q_opt, _ = onnxruntime_outputs(path, x, reference=False)
    lsb = np.abs(q_opt - q_ref)
    return (f"onnxruntime's optimized kernels on this CPU: {np.count_nonzero(lsb)} values "
            f"differ from the reference, max {lsb.max()} LSB")


# quantize_static models, QDQ and QOperator ----------------------------------------------------

@pytest.mark.parametrize("act_type", ["QInt8", "QUInt8", "QInt8-symmetric"])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
@pytest.mark.parametrize("kind", ["conv_relu", "residual", "gemm", "cnn", "cnn_bn",
                                  "mlp_bias", "pool_act"])
def test_matches_onnxruntime(tmp_path, kind, fmt, per_channel, act_type):
    path = quantized(tmp_path, kind, fmt, per_channel, act_type)
    differing, max_lsb, top1, emulated = compare(path)
    print(f"{path.name}: {differing} of {SAMPLES} x {np.prod(dims(path, True))} int8 values "
          f"differ from the reference, max {max_lsb} LSB, top-1 {top1:.0%}; with onnxruntime's "
          f"rounding {emulated} differ; {optimized_difference(path)}")
    assert max_lsb <= 1
    assert top1 == 1.0
    # The exact reference computes QLinearConv/QGemm/QLinearAdd/... as evaluate_onnxruntime
    # does. Not so where the model has a float op that hwonnx computes as a 1x1 layer (the
    # MLP's bias Add, cnn_bn's BatchNorm), nor in QDQ form, where the reference path runs the
    # float Conv, whose float32 sums can land on the other side of a rounding boundary.
    if fmt == "QOperator" and kind not in ("mlp_bias", "cnn_bn"):
        assert emulated == 0


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
@pytest.mark.parametrize("kind", ["conv_relu", "residual", "gemm", "cnn", "mlp_bias"])
def test_onnxruntime_rounding_mode(tmp_path, kind, fmt):
    """On an architecture with the onnxruntime rounding unit, every Conv and Gemm that keeps
    the model's parameters rounds exactly as the integer operator definition (QLinearConv,
    QGemm: float32 scale, half to even): models of only such layers equal the exact reference
    value for value; a residual Add, a global average pool and a separate bias Add still round
    half up (see docs/arithmetic.md). The QDQ model is held to the exact reference of its
    QOperator twin (the same quantize_static parameters): its own reference path computes the
    Conv in float, which differs from any integer accumulation near rounding boundaries."""
    path = quantized(tmp_path, kind, fmt, True, "QInt8")
    twin = quantized(tmp_path, kind, "QOperator", True, "QInt8")
    default = compare(path, reference=twin)
    exact = compare(path, config=ArchConfig(ort_rounding=True), reference=twin)
    print(f"{path.name}: {default[0]} values differ from the exact reference with half-up "
          f"rounding, {exact[0]} with onnxruntime's")
    assert exact[1] <= 1 and exact[2] == 1.0
    assert exact[0] <= default[0]
    if kind in ("conv_relu", "gemm"):
        assert exact[0] == 0


# what the import records --------------------------------------------------------------------

def _initializers(path) -> dict:
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}


def test_annotations_are_the_models_integers(tmp_path):
    path = quantized(tmp_path, "cnn", "QDQ", True, "QUInt8")
    inits = _initializers(path)
    graph = load_model(path)
    quant = graph.meta["quantization"]
    assert quant["source"] == "qdq"
    assert quant["activations"]["x"] == (float(inits["x_scale"]),
                                         int(inits["x_zero_point"]) - 128)
    conv = graph.nodes[0]
    assert conv.name == "c1" and conv.attrs["relu"]   # the Relu onnxruntime removed, kept
    weight = quant["weights"][conv.inputs[1]]
    np.testing.assert_array_equal(weight["q"], inits["c1_w_quantized"])
    np.testing.assert_array_equal(weight["scale"], inits["c1_w_scale"])
    np.testing.assert_array_equal(weight["zero_point"], np.zeros(8))
    np.testing.assert_array_equal(quant["bias"][conv.inputs[2]], inits["c1_b_quantized"])
    np.testing.assert_array_equal(graph.constants[conv.inputs[1]],
                                  inits["c1_w_quantized"] * inits["c1_w_scale"][:, None, None,
                                                                                None])
    fc = graph.nodes[-1]                     # Gemm transB=1: weight stored transposed [K, N]
    np.testing.assert_array_equal(quant["weights"][fc.inputs[1]]["q"],
                                  inits["fc_w_quantized"].T)
    # onnxruntime removed both Relus: the Conv and the Add write r1 and r2 themselves
    assert sorted(quant["activations"]) == ["c2", "f", "g", "r1", "r2", "x", "y"]
    assert [n.attrs["relu"] for n in graph.nodes if n.op != "Flatten"] == [
        True, False, True, True, False]      # r1, c2, r2, g (zero point -128), y


def test_integer_graph_uses_the_models_parameters(tmp_path):
    path = quantized(tmp_path, "residual", "QOperator", True, "QInt8")
    inits = _initializers(path)
    graph, _ = api.compile_model(path, None, config=ArchConfig(), log=lambda *_: None)
    conv = next(n for n in graph.nodes if n.name.startswith("c1"))
    w, bias, mult, shift = (graph.constants[v] for v in conv.inputs[1:5])
    np.testing.assert_array_equal(w, inits["c1_w_quantized"])
    np.testing.assert_array_equal(bias, inits["c1_b_quantized"])
    x_scale, w_scale = np.float32(inits["x_scale"]), inits["c1_w_scale"]
    out_scale = np.float32(inits[conv.outputs[0].replace("_quantized:q", "_scale")])
    multiplier = mult.astype(np.float64) * 2.0 ** -shift.astype(np.float64)
    np.testing.assert_array_equal(multiplier, (x_scale * w_scale / out_scale).astype(
        np.float64))                          # onnxruntime's float32 multiplier, exactly
    assert conv.attrs["in_zp"] == int(inits["x_zero_point"])
    assert conv.attrs["relu"] and conv.attrs["lo"] == conv.attrs["out_zp"] == -128
    assert graph.meta["calibration"] == "from the QOPERATOR model"
    assert graph.meta["calibration_samples"] == 0
    assert "quantization" not in graph.meta


def test_float_model_still_needs_calibration_data(tmp_path):
    onnx.save(float_model("gemm", np.random.default_rng(0)), tmp_path / "gemm.onnx")
    with raises(QuantizationError, "Calibration data is required to quantize a float model: "
                "pass --calib samples.npz (one array per input, first axis = samples) or an "
                ".npy for a single-input model"):
        api.compile_model(tmp_path / "gemm.onnx", None, config=ArchConfig(),
                          log=lambda *_: None)


def test_values_without_parameters_are_calibrated(tmp_path):
    onnx.save(float_model("cnn", np.random.default_rng(7)), tmp_path / "cnn.onnx")
    path = tmp_path / "partial.onnx"
    quantize_static(str(tmp_path / "cnn.onnx"), str(path), Reader((1, 3, 8, 8), 3),
                    quant_format=QuantFormat.QDQ, nodes_to_exclude=["fc"])
    with raises(QuantizationError, "Calibration data is required: the model gives no "
                "quantization parameters for 1 value(s) ('y'); pass --calib samples.npz (one "
                "array per input, first axis = samples) or an .npy for a single-input model"):
        api.compile_model(path, None, config=ArchConfig(), log=lambda *_: None)
    calib = {"x": np.random.default_rng(5).normal(0, 1, (16, 3, 8, 8)).astype(np.float32)}
    graph, _ = api.compile_model(path, calib, config=ArchConfig(), log=lambda *_: None)
    assert graph.meta["calibration"] == "from the QDQ model; min-max for 1 value(s)"
    assert graph.meta["weight_quantization"] == (
        "int8 per output channel: 2 of 3 layer(s) from the QDQ model, the others symmetric "
        "from float")


# hand-built models: MatMulInteger, ConvInteger, weight zero points -----------------------------

def _integer_model(conv: bool, rng):
    """QuantizeLinear -> MatMulInteger/ConvInteger -> Cast -> Mul(scale) -> Add(bias) ->
    QuantizeLinear -> DequantizeLinear; x uint8, weights uint8 with zero point 128 (conv) or
    int8 (matmul)."""
    x_scale = np.float32(4 / 255)
    shape, channels = ([1, 3, 8, 8], 6) if conv else ([1, 16], 10)
    if conv:
        w = rng.integers(0, 256, (channels, 3, 3, 3)).astype(np.uint8)
        w_scale = rng.uniform(0.002, 0.004, channels).astype(np.float32)
        inits = {"w_zp": np.uint8(128), "bias": rng.normal(0, 0.2, (1, channels, 1, 1)),
                 "combined": (x_scale * w_scale).reshape(1, channels, 1, 1),
                 "y_scale": np.float32(0.02)}
        op = helper.make_node("ConvInteger", ["xq", "w", "x_zp", "w_zp"], ["acc"],
                              pads=[1, 1, 1, 1], name="convint")
    else:
        w = rng.integers(-127, 128, (16, channels)).astype(np.int8)
        inits = {"w_zp": np.int8(0), "bias": rng.normal(0, 0.2, channels),
                 "combined": x_scale * np.float32(0.004), "y_scale": np.float32(0.01)}
        op = helper.make_node("MatMulInteger", ["xq", "w", "x_zp", "w_zp"], ["acc"],
                              name="mmint")
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="q"),
             op, helper.make_node("Cast", ["acc"], ["accf"], to=F, name="cast"),
             helper.make_node("Mul", ["accf", "combined"], ["m"], name="scale"),
             helper.make_node("Add", ["m", "bias"], ["a"], name="bias"),
             helper.make_node("QuantizeLinear", ["a", "y_scale", "y_zp"], ["aq"], name="qy"),
             helper.make_node("DequantizeLinear", ["aq", "y_scale", "y_zp"], ["y"], name="dq")]
    inits.update(x_scale=x_scale, x_zp=np.uint8(128), w=w, y_zp=np.int8(0),
                 bias=inits["bias"].astype(np.float32))
    return onnx_model(nodes, inits, shape, [1, channels, 8, 8] if conv else [1, channels])


@pytest.mark.parametrize("conv", [False, True], ids=["MatMulInteger", "ConvInteger"])
def test_integer_operators_match_onnxruntime(tmp_path, conv):
    path = tmp_path / "integer.onnx"
    onnx.save(_integer_model(conv, np.random.default_rng(2)), path)
    graph = load_model(path)
    assert [n.op for n in graph.nodes] == ["Conv" if conv else "Dense"]
    differing, max_lsb, top1, _ = compare(path)
    print(f"{'ConvInteger' if conv else 'MatMulInteger'}: {differing} of {SAMPLES} x "
          f"{np.prod(dims(path, True))} int8 values differ from onnxruntime, max {max_lsb} "
          f"LSB, top-1 {top1:.0%}")
    assert max_lsb <= 1 and top1 == 1.0


def _qdq_conv(w_q: np.ndarray, w_zp: int):
    """A QDQ Conv with uint8 weights of zero point ``w_zp``."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="dqx"),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="dqw"),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"], name="qy"),
             helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"], name="dqy")]
    inits = {"xs": np.float32(4 / 255), "xz": np.uint8(128), "wq": w_q, "ws": np.float32(0.01),
             "wz": np.uint8(w_zp), "ys": np.float32(0.05), "yz": np.uint8(128)}
    return onnx_model(nodes, inits, [1, 2, 6, 6], [1, 4, 6, 6])


def test_weight_zero_point_is_folded(tmp_path):
    w_q = np.random.default_rng(4).integers(0, 138, (4, 2, 3, 3)).astype(np.uint8)
    onnx.save(_qdq_conv(w_q, 10), tmp_path / "zp.onnx")
    graph, _ = api.compile_model(tmp_path / "zp.onnx", None, config=ArchConfig(),
                                 log=lambda *_: None)
    conv = next(n for n in graph.nodes if n.op == "QConv")
    np.testing.assert_array_equal(graph.constants[conv.inputs[1]], w_q.astype(np.int64) - 10)
    differing, max_lsb, _, _ = compare(tmp_path / "zp.onnx")
    assert max_lsb <= 1, differing


def test_weight_zero_point_outside_int8_is_refused(tmp_path):
    w_q = np.full((4, 2, 3, 3), 100, np.uint8)
    w_q[0, 1, 2, 0] = 0
    onnx.save(_qdq_conv(w_q, 200), tmp_path / "zp.onnx")
    with raises(QuantizationError, "Layer 'conv': the weight zero point of output channel 0 "
                "takes q - zero_point to -200, outside int8 [-128, 127]; the array multiplies "
                "int8 weights without a zero point"):
        api.compile_model(tmp_path / "zp.onnx", None, config=ArchConfig(), log=lambda *_: None)


# refusals ----------------------------------------------------------------------------------------

def _qdq(nodes, inits, inputs=(), out_type=F):
    return onnx_model(nodes, inits, [1, 4], [1, 4], inputs, out_type)


_S, _Z = np.float32(0.02), np.int8(3)
_PAIR = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q"),
         helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["y"], name="dq")]


@pytest.mark.parametrize("model, message", [
    (_qdq(_PAIR, {"z": _Z}, inputs=(("s", []),)),
     "QuantizeLinear 'q' needs a constant scale, but 's' is computed at run time; hwonnx "
     "imports static quantization parameters only"),
    (_qdq(_PAIR, {"s": np.full(4, _S), "z": np.full(4, _Z)}),
     "QuantizeLinear 'q' quantizes the run-time tensor 'x' per axis; hwonnx quantizes "
     "activations per tensor"),
    (_qdq([_PAIR[0], helper.make_node("DequantizeLinear", ["xq", "s2", "z"], ["y"], name="dq")],
          {"s": _S, "s2": np.float32(0.04), "z": _Z}),
     "DequantizeLinear 'dq' gives 'xq' scale 0.04 and zero point 3, but it already has scale "
     "0.02 and zero point 3 (zero points as int8); hwonnx keeps one set of quantization "
     "parameters per tensor"),
    (_qdq([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], name="q")],
          {"s": _S, "z": _Z}, out_type=TensorProto.INT8),
     "Graph output 'y' has type int8; hwonnx's outputs are float: end the model with a "
     "DequantizeLinear"),
    (_qdq([_PAIR[0], helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["y"], name="dq")],
          {"s": _S, "z": np.int32(3)}),
     "QuantizeLinear 'q' quantizes the run-time tensor 'x' to int32; hwonnx's activations are "
     "int8 or uint8"),
    (_qdq([_PAIR[0], helper.make_node("MatMulInteger", ["xq", "w", "z"], ["acc"], name="mm"),
           helper.make_node("Cast", ["acc"], ["y"], to=F, name="cast")],
          {"s": _S, "z": _Z, "w": np.ones((4, 4), np.int8)}),
     "MatMulInteger 'mm' must be followed by a Cast to float and a Mul by a constant scale "
     "(its int32 result has no scale of its own)"),
    (_qdq([helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dyn"),
           helper.make_node("MatMulInteger", ["xq", "w", "xz"], ["acc"], name="mm"),
           helper.make_node("Cast", ["acc"], ["accf"], to=F, name="cast"),
           helper.make_node("Mul", ["accf", "xs"], ["y"], name="mul")],
          {"w": np.ones((4, 4), np.uint8)}),
     "MatMulInteger 'mm' reads 'xq', whose scale is not known before run time; hwonnx needs "
     "'xq' written by a QuantizeLinear with constant parameters"),
], ids=["runtime-scale", "per-axis-activation", "two-parameter-sets", "int8-output",
        "int32-activation", "integer-op-without-scale", "dynamic-quantization"])
def test_import_refusals(model, message):
    with raises(ModelError, message):
        load_model(model)


def test_qgemm_alpha_is_refused(tmp_path):
    path = quantized(tmp_path, "gemm", "QOperator", False, "QInt8")
    model = onnx.load(str(path))
    gemm = next(n for n in model.graph.node if n.op_type == "QGemm")
    gemm.attribute.append(helper.make_attribute("alpha", 0.5))
    with raises(ModelError, f"QGemm '{gemm.name}' has alpha=0.5; hwonnx imports QGemm with "
                f"alpha=1 only"):
        load_model(model)


def test_layout_op_cannot_requantize(tmp_path):
    path = quantized(tmp_path, "cnn", "QDQ", False, "QInt8")
    model = onnx.load(str(path))
    model.graph.initializer.append(numpy_helper.from_array(np.float32(0.5), "f_scale"))
    for node in model.graph.node:
        if node.input and node.input[0] in ("f", "f_QuantizeLinear_Output"):
            node.input[1] = "f_scale"
    g_scale = float(_initializers(path)["g_scale"])
    with raises(QuantizationError, f"Flatten 'flatten': its output 'f' is quantized with "
                f"scale 0.5 and zero point -128, its input 'g' with scale {g_scale:.6g} and "
                f"zero point -128; a layout op cannot requantize"):
        api.compile_model(model, None, config=ArchConfig(), log=lambda *_: None)


def test_add_weights_are_the_best_int8_pair():
    assert add_weights(0.5, 0.25, 0, 0) == (126, 63, 0.5 / 126)       # exact: error 0
    w = np.arange(1, 128, dtype=np.float64)
    wa, wb = np.meshgrid(w, w, indexing="ij")
    rng = np.random.default_rng(0)
    for ra, rb in 10 ** rng.uniform(-1, 0.5, (20, 2)):
        za, zb = (int(z) for z in rng.integers(-128, 128, 2))
        span_a, span_b = max(-128 - za, 127 - za, key=abs), max(-128 - zb, 127 - zb, key=abs)
        errors = [abs(span_a) * np.abs(wa * m - ra) + abs(span_b) * np.abs(wb * m - rb)
                  for m in (ra / wa, rb / wb)]                     # every pair, both kinks
        best = min(float(e.min()) for e in errors)
        a, b, m = add_weights(ra, rb, za, zb)
        error = abs(span_a) * abs(a * m - ra) + abs(span_b) * abs(b * m - rb)
        assert error <= best * (1 + 1e-9) + 1e-12, (ra, rb, za, zb)


# on the RTL ----------------------------------------------------------------------------------

@pytest.mark.rtl
@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
@pytest.mark.parametrize("kind", ["cnn", "mlp_bias", "pool_act"])
def test_prequantized_models_on_rtl(tmp_path, kind, fmt):
    """quantize_static models with their own parameters on the RTL (the 4x4 configuration of
    tests/end_to_end/test_rtl.py, which has the onnxruntime rounding unit): bit-exact with the
    golden model, cycles as predicted, and the onnxruntime comparison of the golden model within
    the issue's bound."""
    from tests.end_to_end.test_ort_rounding_rtl import ORT_CONFIG

    path = quantized(tmp_path, kind, fmt, True, "QUInt8")
    result = api.build(path, None, calib=None, config=ORT_CONFIG, verilog=False,
                       log=lambda *_: None)
    assert any(i.get("rne") for i in result.program.expanded())
    x = np.random.default_rng(3).normal(0, 1, (16, *dims(path)[1:])).astype(np.float32)
    golden = api.simulate(result, {"x": x}, mode="golden")
    rtl = api.simulate(result, {"x": x}, mode="rtl", log=lambda *_: None)
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [golden.predicted_cycles] * len(x)
    differing, max_lsb, top1, _ = compare(path, config=ORT_CONFIG)
    print(f"{path.name} on RTL: bit-exact with golden; golden vs onnxruntime: {differing} "
          f"values differ, max {max_lsb} LSB, top-1 {top1:.0%}")
    assert max_lsb <= 1 and top1 == 1.0
