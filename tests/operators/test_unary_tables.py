"""The unary table operators added to LeakyRelu/Sigmoid/Tanh/HardSigmoid/HardSwish (issue 13):
Elu, Selu, Celu, Softplus, Softsign, Gelu (none and tanh), Mish, ThresholdedRelu, Exp, Neg,
Abs, Erf, Swish, Log, Sqrt, Reciprocal, Sign, Floor, Ceil, Round. Each float function against
onnx's ReferenceEvaluator; each after a Conv and after a
Gemm in a hand-written QDQ model, the golden int8 output against onnxruntime's reference path
(no graph optimization: DequantizeLinear -> float op -> QuantizeLinear as written); and two
of them on the RTL, bit-exact with golden in the predicted cycles."""

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from hwonnx.api import build, simulate
from hwonnx.frontend import load_model
from hwonnx.ir.evaluate import evaluate_float
from hwonnx.ir.tables import TABLE_OPS
from ort_reference import reference_session
from spec_helpers import make_model

#: op, attributes given (the rest are ONNX's defaults), ai.onnx opset of the model
UNARY = [("Elu", {}, 17), ("Elu", {"alpha": 0.5}, 17),
         ("Selu", {}, 17), ("Selu", {"alpha": 1.5, "gamma": 0.9}, 17),
         ("Celu", {}, 17), ("Celu", {"alpha": 2.0}, 17),
         ("Softplus", {}, 17), ("Softsign", {}, 17),
         ("Gelu", {}, 20), ("Gelu", {"approximate": "tanh"}, 20),
         ("Mish", {}, 18), ("ThresholdedRelu", {}, 17), ("ThresholdedRelu", {"alpha": 0.3}, 17),
         ("Exp", {}, 17), ("Neg", {}, 17), ("Abs", {}, 17), ("Erf", {}, 17),
         ("Swish", {}, 24), ("Swish", {"alpha": -0.7}, 24),
         ("Log", {}, 17), ("Sqrt", {}, 17), ("Reciprocal", {}, 17),
         ("Sign", {}, 17), ("Floor", {}, 17), ("Ceil", {}, 17), ("Round", {}, 17)]
#: Defined for positive inputs only (NaN for negative ones; an infinity at 0): tested after a
#: layer whose quantized output is non-negative (zero point -128), where every table entry in
#: use is finite or a saturated infinity, never NaN.
POSITIVE_DOMAIN = ("Log", "Sqrt", "Reciprocal")
#: Step functions: a jump of this size at each step, flat in between (no slope bound).
JUMPS = {"Sign": 1.0, "Floor": 1.0, "Ceil": 1.0, "Round": 1.0}
IDS = [f"{op}{'-' + '-'.join(f'{k}{v}' for k, v in a.items()) if a else ''}"
       for op, a, _ in UNARY]
NEW_OPS = sorted({op for op, _, _ in UNARY})


def _unary_model(op, attrs, opset, shape=(2, 3, 5, 7)):
    return make_model([helper.make_node(op, ["x"], ["y"], name="act", **attrs)],
                      {"x": list(shape)}, {"y": list(shape)}, opset=opset)


@pytest.mark.parametrize("op, attrs, opset", UNARY, ids=IDS)
def test_float_function_matches_the_onnx_reference(op, attrs, opset):
    """hwonnx's float op (ONNX's defaults for attributes not given) against onnx's
    ReferenceEvaluator on random inputs, over [-6, 6] and some large magnitudes."""
    model = _unary_model(op, attrs, opset)
    graph = load_model(model)
    (node,) = graph.nodes
    assert node.op == op
    assert set(node.attrs) == set(TABLE_OPS[op].defaults)
    rng = np.random.default_rng(1)
    x = rng.uniform(-6, 6, (2, 3, 5, 7)).astype(np.float32)
    x.flat[:6] = [-30.0, -12.5, 0.0, 12.5, 30.0 if op != "Exp" else 20.0, -0.0]
    got = evaluate_float(graph, {"x": x})["y"]
    with np.errstate(divide="ignore", invalid="ignore"):     # Log, Sqrt of x <= 0
        (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


def test_spec_defaults_are_onnxs():
    assert TABLE_OPS["Elu"].defaults == {"alpha": 1.0}
    assert TABLE_OPS["Selu"].defaults == {"alpha": 1.67326319217681884765625,
                                          "gamma": 1.05070102214813232421875}
    assert TABLE_OPS["Celu"].defaults == {"alpha": 1.0}
    assert TABLE_OPS["ThresholdedRelu"].defaults == {"alpha": 1.0}
    assert TABLE_OPS["Gelu"].defaults == {"approximate": "none"}


def test_gelu_approximate_must_be_none_or_tanh():
    from hwonnx.errors import ModelError
    with pytest.raises(ModelError, match="Gelu 'act' has approximate='fast'; ONNX defines "
                                         "'none' or 'tanh'"):
        load_model(_unary_model("Gelu", {"approximate": "fast"}, 20))


def _q(name, value, dtype=np.int8):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def qdq_model(layer, op, attrs, opset, rng):
    """x -> Q/DQ -> Conv 3x3 (or Gemm) with int8 weights and int32 bias -> Q/DQ -> op -> Q/DQ
    -> y, every scale and zero point given: hwonnx takes them all from the model."""
    s_x, s_w, s_c, z_c = 0.02, 0.01, 0.04, (-128 if op in POSITIVE_DOMAIN else 3)
    probe = np.linspace(-128 - z_c, 127 - z_c, 256, dtype=np.float32) * np.float32(s_c)
    with np.errstate(divide="ignore"):
        y_range = TABLE_OPS[op].fn(probe, {**TABLE_OPS[op].defaults, **attrs})
    y_range = y_range[np.isfinite(y_range)]
    lo, hi = min(float(y_range.min()), 0.0), max(float(y_range.max()), 0.0)
    s_y = (hi - lo) / 255
    z_y = int(np.clip(round(-128 - lo / s_y), -128, 127))
    if layer == "conv":
        w = rng.integers(-40, 41, (4, 3, 3, 3))
        x_shape, y_shape = [1, 3, 6, 6], [1, 4, 6, 6]
        mm = helper.make_node("Conv", ["xd", "wd", "bd"], ["c"], name="conv", pads=[1, 1, 1, 1])
    else:
        w = rng.integers(-40, 41, (6, 24))
        x_shape, y_shape = [1, 24], [1, 6]
        mm = helper.make_node("Gemm", ["xd", "wd", "bd"], ["c"], name="fc", transB=1)
    bias = rng.integers(-2000, 2001, w.shape[0])
    inits = [_q("w", w), _q("b", bias, np.int32),
             numpy_helper.from_array(np.float32(s_x), "s_x"), _q("z_x", 0),
             numpy_helper.from_array(np.float32(s_w), "s_w"), _q("z_w", 0),
             numpy_helper.from_array(np.float32(s_x * s_w), "s_b"), _q("z_b", 0, np.int32),
             numpy_helper.from_array(np.float32(s_c), "s_c"), _q("z_c", z_c),
             numpy_helper.from_array(np.float32(s_y), "s_y"), _q("z_y", z_y)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_x", "z_x"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "s_x", "z_x"], ["xd"], name="dqx"),
             helper.make_node("DequantizeLinear", ["w", "s_w", "z_w"], ["wd"], name="dqw"),
             helper.make_node("DequantizeLinear", ["b", "s_b", "z_b"], ["bd"], name="dqb"),
             mm,
             helper.make_node("QuantizeLinear", ["c", "s_c", "z_c"], ["cq"], name="qc"),
             helper.make_node("DequantizeLinear", ["cq", "s_c", "z_c"], ["cd"], name="dqc"),
             helper.make_node(op, ["cd"], ["a"], name="act", **attrs),
             helper.make_node("QuantizeLinear", ["a", "s_y", "z_y"], ["yq"], name="qy"),
             helper.make_node("DequantizeLinear", ["yq", "s_y", "z_y"], ["y"], name="dqy")]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, x_shape)], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, y_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", max(opset, 19))])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model, (s_c, s_y, x_shape)


@pytest.mark.parametrize("layer", ["conv", "gemm"])
@pytest.mark.parametrize("op, attrs, opset", UNARY, ids=IDS)
def test_after_a_layer_within_one_rounding_of_onnxruntime(layer, op, attrs, opset):
    """Conv -> op and Gemm -> op in QDQ form: the table is fused into the layer, and the
    golden int8 output is onnxruntime's reference path (float layer on dequantized values,
    QuantizeLinear, float op, QuantizeLinear) except where the layer's requantization (a
    31-bit fixed-point multiplier, against onnxruntime's float32 sum and division) lands on the
    other side of a rounding boundary: the layer's int8 output then differs by 1 LSB, which
    the function moves by at most ``slope * s_c``, so the output differs by at most
    ``floor(slope * s_c / s_y) + 1`` LSB; for Exp (unbounded slope) the slope on the layer's
    output range, for ThresholdedRelu (a jump of alpha) the jump plus the slope 1. And those
    are rare: at most 2% of the outputs differ at all."""
    rng = np.random.default_rng(5)
    model, (s_c, s_y, x_shape) = qdq_model(layer, op, attrs, opset, rng)
    result = build(model, None, calib=None, verilog=False, log=lambda m: None)
    (hosts,) = [n for n in result.graph.nodes if n.attrs.get("table") is not None]
    assert hosts.op == ("QConv" if layer == "conv" else "QDense")
    assert hosts.attrs["activation"] == op
    x = rng.normal(0, 1.2, (40, *x_shape[1:])).astype(np.float32)
    got = simulate(result, {"x": x}, mode="golden").outputs["y"]
    session = reference_session(model)
    want = np.concatenate([session.run(None, {"x": sample[None]})[0] for sample in x])
    lsb = np.rint(np.abs(got.reshape(want.shape) - want) / s_y).astype(int)
    full = {**TABLE_OPS[op].defaults, **attrs}
    slope = TABLE_OPS[op].slope(full)
    if op == "Exp":
        slope = math.exp(127 * s_c)
    if op in POSITIVE_DOMAIN:      # the largest slope on the layer's grid above 0, at s_c
        slope = {"Log": 1 / s_c, "Sqrt": 0.5 / math.sqrt(s_c), "Reciprocal": 1 / s_c ** 2}[op]
    if op == "ThresholdedRelu":
        bound = math.floor((full["alpha"] + s_c) / s_y) + 1
    elif op in JUMPS:
        bound = math.floor(JUMPS[op] / s_y) + 1
    else:
        bound = math.floor(slope * s_c / s_y) + 1
    print(f"\n{layer}->{op} {attrs}: {np.count_nonzero(lsb)} of {lsb.size} int8 outputs differ "
          f"from onnxruntime's reference path, max {lsb.max()} LSB (bound {bound})")
    assert lsb.max() <= bound
    assert np.count_nonzero(lsb) <= 0.02 * lsb.size


@pytest.mark.rtl
def test_two_new_tables_on_rtl(tmp_path):
    """Conv -> Gelu -> Conv -> Elu -> Gemm -> Softsign: three of the new tables, each fused
    into its layer; the RTL equals golden bit for bit, in the predicted cycles."""
    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (6, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.3, (4, 6, 3, 3)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.normal(0, 0.3, (5, 64)).astype(np.float32), "fc")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Gelu", ["c1"], ["g1"], name="gelu"),
             helper.make_node("Conv", ["g1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Elu", ["c2"], ["e2"], name="elu", alpha=0.7),
             helper.make_node("Flatten", ["e2"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc"], ["l"], name="fc", transB=1),
             helper.make_node("Softsign", ["l"], ["y"], name="softsign")]
    model = make_model(nodes, {"x": [1, 3, 4, 4]}, {"y": [1, 5]},
                       {i.name: numpy_helper.to_array(i) for i in inits}, opset=20)
    calib = rng.normal(0, 1, (32, 1, 3, 4, 4)).astype(np.float32)
    result = build(model, tmp_path / "build", calib={"x": calib}, log=lambda m: None)
    tables = [(n.op, n.attrs["activation"]) for n in result.graph.nodes if "table" in n.attrs]
    assert tables == [("QConv", "Gelu"), ("QConv", "Elu"), ("QDense", "Softsign")]
    inputs = {"x": rng.normal(0, 1, (6, 1, 3, 4, 4)).astype(np.float32)}
    rtl = simulate(tmp_path / "build", inputs, mode="compare", log=lambda m: None)
    golden = simulate(result, inputs, mode="golden")
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [rtl.predicted_cycles] * 6


@pytest.mark.rtl
def test_swish_sqrt_and_round_tables_on_rtl(tmp_path):
    """Conv -> Swish -> Conv -> Relu -> Sqrt -> Gemm -> Round: Swish and Sqrt fused into their
    layers (Sqrt after the fused ReLU), Round on the Gemm's output; RTL equals golden bit for
    bit, in the predicted cycles, and Sqrt's table is only ever indexed inside its domain."""
    rng = np.random.default_rng(12)
    inits = {"w1": rng.normal(0, 0.4, (6, 3, 3, 3)).astype(np.float32),
             "w2": rng.normal(0, 0.3, (4, 6, 3, 3)).astype(np.float32),
             "fc": rng.normal(0, 0.6, (5, 64)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Swish", ["c1"], ["s1"], name="swish"),
             helper.make_node("Conv", ["s1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu"),
             helper.make_node("Sqrt", ["r2"], ["q2"], name="sqrt"),
             helper.make_node("Flatten", ["q2"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc"], ["l"], name="fc", transB=1),
             helper.make_node("Round", ["l"], ["y"], name="round")]
    model = make_model(nodes, {"x": [1, 3, 4, 4]}, {"y": [1, 5]}, inits, opset=24)
    calib = rng.normal(0, 1, (32, 1, 3, 4, 4)).astype(np.float32)
    result = build(model, tmp_path / "build", calib={"x": calib}, log=lambda m: None)
    tables = [(n.op, n.attrs["activation"]) for n in result.graph.nodes if "table" in n.attrs]
    assert tables == [("QConv", "Swish"), ("QConv", "Sqrt"), ("QDense", "Round")]
    inputs = {"x": rng.normal(0, 1, (6, 1, 3, 4, 4)).astype(np.float32)}
    rtl = simulate(tmp_path / "build", inputs, mode="compare", log=lambda m: None)
    golden = simulate(result, inputs, mode="golden")
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [rtl.predicted_cycles] * 6
    want = evaluate_float(load_model(model), {"x": inputs["x"][:, 0]})["y"]
    got = golden.outputs["y"].reshape(want.shape)
    (dq,) = [n for n in result.graph.nodes if n.op == "Dequantize"]
    # Round's outputs are integers, each quantized to the nearest step of the output grid
    assert np.abs(got - np.round(got)).max() <= dq.attrs["scale"] / 2 + 1e-6
    print(f"\nSwish/Sqrt/Round network: golden vs float max |diff| "
          f"{np.abs(got - want).max():.3f}")
