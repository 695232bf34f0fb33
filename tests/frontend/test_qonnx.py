"""QONNX models (Brevitas/QKeras exports): ``Quant``/``BipolarQuant`` read, mapped onto int8
weights and n-bit requantization ranges, compared with qonnx's own reference executor
(``qonnx.core.onnx_exec.execute_onnx`` on ``ModelWrapper(model)``): golden equal to it bit for
bit where the arithmetic is integer (power-of-two scales and quantized biases, so that qonnx's
float32 arithmetic is exact), within one output step otherwise (the differences printed); the
RTL equal to golden bit for bit in the predicted cycles."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from hwonnx import api
from hwonnx.config import ArchConfig
from hwonnx.errors import ModelError
from hwonnx.frontend import load_model
from helpers import raises
from qonnx_helpers import (CHANNELS_LAST, ORT_CONFIG, QONNX, SAMPLES, Builder, conv_net, golden,
                           reference, steps)
from rtl_helpers import rtl_matches_golden


EXACT = {   # power-of-two scales and Int32 biases: qonnx's float32 arithmetic is exact
    "w8a8": dict(wbits=8, abits=8),
    "w4a4": dict(wbits=4, abits=4),
    "w2a2_per_tensor": dict(wbits=2, abits=2, per_channel=False),
    "w1a1": dict(wbits=1, abits=1),                   # BipolarQuant weights, binary activations
    "w3a5": dict(wbits=3, abits=5),
    "w6a3_signed_narrow": dict(wbits=6, abits=3, signed_act=True, narrow_act=True),
    "w5a4_signed": dict(wbits=5, abits=4, signed_act=True),
    "w8a7_narrow_unsigned": dict(wbits=8, abits=7, narrow_act=True),
    "w4a4_brevitas_domain": dict(wbits=4, abits=4, domain="onnx.brevitas"),
}


@pytest.mark.parametrize("case", sorted(EXACT))
def test_power_of_two_models_equal_qonnx_bit_for_bit(case):
    rng = np.random.default_rng(1)
    model = conv_net(3, **EXACT[case])
    xs = rng.normal(0, 1, (SAMPLES, 3, 8, 8)).astype(np.float32)
    want = reference(model, xs)
    _, result = golden(model, xs)
    np.testing.assert_array_equal(result.outputs["y"], want)


INEXACT = {  # float biases, arbitrary scales, a BatchNormalization folded into the layer
    "w8a8_float_bias": dict(wbits=8, abits=8, int_bias=False),
    "w4a4_arbitrary": dict(wbits=4, abits=4, pow2=False),
    "w4a4_batchnorm": dict(wbits=4, abits=4, bn=True),
    "w8a8_arbitrary_batchnorm": dict(wbits=8, abits=8, pow2=False, bn=True, int_bias=False),
    "w2a3_arbitrary_per_tensor": dict(wbits=2, abits=3, pow2=False, per_channel=False),
}


@pytest.mark.parametrize("case", sorted(INEXACT))
def test_other_models_within_one_step_of_qonnx(case):
    rng = np.random.default_rng(2)
    model = conv_net(4, **INEXACT[case])
    xs = rng.normal(0, 1, (32, 3, 8, 8)).astype(np.float32)
    want = reference(model, xs)
    _, result = golden(model, xs)
    scale = float(numpy_helper.to_array(next(i for i in model.graph.initializer
                                             if i.name == "y_s")))
    diff = steps(result.outputs["y"], want, scale)
    print(f"{case}: {np.count_nonzero(diff)} of {diff.size} outputs differ from qonnx's "
          f"executor, by at most {np.abs(diff).max()} step(s)")
    assert np.abs(diff).max() <= 1
    assert np.count_nonzero(diff) < diff.size // 10


def test_weights_are_the_models_integers():
    """The integer graph holds the quantizers' integers (4-bit, narrow: within [-7, 7], held
    as multiples of 2^k only where a float bias asks for a finer grid) and the activation
    quantizers' ranges as clamps."""
    model = conv_net(5, wbits=4, abits=3)
    result, _ = golden(model, np.zeros((1, 3, 8, 8), np.float32))
    layers = {n.name: n for n in result.graph.nodes if n.op in ("QConv", "QDense")}
    for name in ("c1", "c2"):
        w = result.graph.constants[layers[name].inputs[1]]
        assert w.min() >= -7 and w.max() <= 7 and len(np.unique(w)) > 4
    assert (layers["c1"].attrs["lo"], layers["c1"].attrs["hi"]) == (0, 7)   # 3-bit unsigned
    assert (layers["c2"].attrs["lo"], layers["c2"].attrs["hi"]) == (0, 7)
    assert (layers["g"].attrs["lo"], layers["g"].attrs["hi"]) == (-128, 127)
    assert layers["c1"].attrs["out_zp"] == 0 and layers["c1"].attrs["rounding"] == "ort"


def test_float_bias_widens_low_bit_weights():
    model = conv_net(5, wbits=4, abits=4, int_bias=False)
    result, _ = golden(model, np.zeros((1, 3, 8, 8), np.float32))
    w = result.graph.constants[next(n for n in result.graph.nodes if n.name == "c2").inputs[1]]
    assert np.all(w % 16 == 0) and np.abs(w).max() <= 112       # 4-bit narrow x 16
    assert any("multiples of 16" in note for note in result.graph.meta["notes"])


def test_missing_opset_import_is_read_with_a_warning():
    model = conv_net(6, wbits=8, abits=8)
    del model.opset_import[1:]
    graph = load_model(model)
    assert any(w.startswith("Node 'q_xq' uses Quant of domain 'qonnx.custom_op.general', "
                            "which the model's opset_import does not import: the file is not "
                            "valid ONNX IR as it stands") for w in graph.meta["warnings"])
    model.graph.node[0].domain = "my.custom.domain"
    with pytest.raises(ModelError, match="domain 'my.custom.domain', which the model's "
                                         "opset_import does not import"):
        load_model(model)


def test_finn_domain_is_read_as_qonnx():
    """FINN's domain name for the same operators: equal to the qonnx-domain model."""
    rng = np.random.default_rng(7)
    xs = rng.normal(0, 1, (4, 3, 8, 8)).astype(np.float32)
    want = reference(conv_net(8, 4, 4), xs)
    _, result = golden(conv_net(8, 4, 4, domain="finn.custom_op.general"), xs)
    np.testing.assert_array_equal(result.outputs["y"], want)


@pytest.mark.parametrize("attr, message", [
    ("narrow", "Quant 'q_xq' has no attribute 'narrow'; qonnx's reference executor requires "
               "it (its documentation gives a default, its code none): set it explicitly"),
    ("signed", "Quant 'q_xq' has no attribute 'signed'; qonnx's reference executor requires "
               "it (its documentation gives a default, its code none): set it explicitly"),
])
def test_missing_signed_or_narrow_is_refused(attr, message):
    model = conv_net(9, 8, 8)
    node = model.graph.node[0]
    kept = [a for a in node.attribute if a.name != attr]
    del node.attribute[:]
    node.attribute.extend(kept)
    with raises(ModelError, message):
        load_model(model)


def test_refused_by_name():
    model = conv_net(10, 8, 8)
    model.graph.node[0].op_type = "FloatQuant"
    with raises(ModelError, "FloatQuant 'q_xq' is a floating-point (minifloat, fp8) quantizer; "
                            "hwonnx's arithmetic is integer: FloatQuant is not supported"):
        load_model(model)
    model = conv_net(10, 8, 8)
    for a in model.graph.node[0].attribute:
        if a.name == "rounding_mode":
            a.s = b"FLOOR"
    with raises(ModelError, "Quant 'q_xq' rounds the run-time tensor 'x' with rounding_mode "
                            "FLOOR; hwonnx requantizes activations with ROUND (half to even)"):
        load_model(model)


def _with_initializer(name: str, value) -> onnx.ModelProto:
    model = conv_net(9, 8, 8)
    init = next(i for i in model.graph.initializer if i.name == name)
    init.CopyFrom(numpy_helper.from_array(np.asarray(value, np.float32), name))
    return model


@pytest.mark.parametrize("name, value, node", [
    ("xq_b", np.nan, "q_xq"), ("xq_b", np.inf, "q_xq"),      # an activation quantizer
    ("w1_b", np.nan, "q_w1"), ("w1_b", -np.inf, "q_w1"),     # a weight quantizer
])
def test_bit_width_that_is_not_finite_is_refused_by_name(name, value, node):
    """int() of a NaN or infinite bit width took a ValueError/OverflowError traceback."""
    with raises(ModelError, f"Quant '{node}' has bit width [{value}]; hwonnx reads one "
                            f"integer bit width from 1 to 32"):
        load_model(_with_initializer(name, value))


@pytest.mark.parametrize("name, shape, what, weight, weight_shape", [
    ("w1_s", [5, 1, 1, 1], "scale", "w1", [6, 3, 3, 3]),
    ("w1_s", [6, 2, 1, 1], "scale", "w1", [6, 3, 3, 3]),
    ("w1_z", [5, 1, 1, 1], "zero point", "w1", [6, 3, 3, 3]),
    ("w1_z", [1, 1, 1, 1, 1], "zero point", "w1", [6, 3, 3, 3]),
    ("w3_s", [3, 1], "scale", "w3", [10, 128]),
    ("w3_z", [3], "zero point", "w3", [10, 128]),
])
def test_scale_or_zero_point_that_does_not_broadcast_is_refused_by_name(
        name, shape, what, weight, weight_shape):
    """A weight quantizer's scale or zero point of a shape that does not broadcast to the
    weight took a NumPy broadcasting traceback."""
    value = np.full(shape, 0.01 if what == "scale" else 0.0, np.float32)
    with raises(ModelError, f"Quant 'q_{weight}' has a {what} of shape {shape}, which does not "
                            f"broadcast to '{weight}_float' of shape {weight_shape} (QONNX: "
                            f"the {what} broadcasts to the input)"):
        load_model(_with_initializer(name, value))


def test_weight_rounding_modes_follow_qonnx():
    """A weight quantizer's rounding mode (here FLOOR, CEIL, HALF_UP) is applied on the host,
    exactly as qonnx's executor applies it."""
    rng = np.random.default_rng(11)
    xs = rng.normal(0, 1, (4, 16)).astype(np.float32)
    for rounding in ("FLOOR", "CEIL", "HALF_UP", "DOWN"):
        b = Builder(np.random.default_rng(12))
        b.quant("x", "xq", 1 / 16, 8)
        w, s_w = b.weight("w", (10, 16), 5, rounding=rounding)
        bias = b.bias("b", 10, np.float32(1 / 16) * s_w, True)
        b.quant(b.node("Gemm", ["xq", w, bias], "g", transB=1), "y", 1 / 8, 8)
        model = b.model([1, 16], "y", [1, 10])
        _, result = golden(model, xs)
        np.testing.assert_array_equal(result.outputs["y"], reference(model, xs))


def channels_last_net(seed: int) -> onnx.ModelProto:
    """x NCHW -> Transpose -> Quant -> channels-last Conv (4-bit weights) -> channels-last
    BatchNormalization -> Relu -> Quant (4-bit) -> channels-last MaxPool -> Transpose ->
    Flatten -> Gemm -> Quant: as qonnx's ConvertToChannelsLastAndClean writes it."""
    b = Builder(np.random.default_rng(seed))
    b.node("Transpose", ["x"], "xt", perm=[0, 2, 3, 1])
    b.quant("xt", "xq", 1 / 32, 8)
    w, s_w = b.weight("w", (6, 3, 3, 3), 4)            # [M, KH, KW, C]
    b.node("Conv", ["xq", w, b.bias("b", 6, np.float32(1 / 32) * s_w, True)], "c",
           domain=CHANNELS_LAST, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
           dilations=[1, 1], group=1)
    b.node("BatchNormalization", ["c", b.const("bn_g", b.rng.uniform(0.5, 1.5, 6)),
                                  b.const("bn_b", b.rng.normal(0, .1, 6)),
                                  b.const("bn_m", b.rng.normal(0, .1, 6)),
                                  b.const("bn_v", b.rng.uniform(.5, 2, 6))], "n",
           domain=CHANNELS_LAST, epsilon=1e-5)
    b.quant(b.node("Relu", ["n"], "r"), "a", 0.25, 4, signed=False)
    b.node("MaxPool", ["a"], "p", domain=CHANNELS_LAST, kernel_shape=[2, 2], strides=[2, 2],
           pads=[0, 0, 0, 0])
    b.node("Transpose", ["p"], "pt", perm=[0, 3, 1, 2])
    w2, s_w2 = b.weight("w2", (10, 6 * 4 * 4), 8)
    g = b.node("Gemm", [b.node("Flatten", ["pt"], "f"), w2,
                        b.bias("b2", 10, np.float32(0.25) * s_w2, True)], "g", transB=1)
    b.quant(g, "y", 1 / 16, 8)
    b.shapes.update(w=[6, 3, 3, 3], xt=[1, 8, 8, 3], xq=[1, 8, 8, 3], c=[1, 8, 8, 6],
                    n=[1, 8, 8, 6], r=[1, 8, 8, 6], a=[1, 8, 8, 6], p=[1, 4, 4, 6])
    return b.model([1, 3, 8, 8], "y", [1, 10], imports=(QONNX, CHANNELS_LAST))


def test_channels_last_ops_are_their_nchw_twins():
    rng = np.random.default_rng(13)
    model = channels_last_net(14)
    xs = rng.normal(0, 1, (SAMPLES, 3, 8, 8)).astype(np.float32)
    want = reference(model, xs)
    result, golden_result = golden(model, xs)
    diff = steps(golden_result.outputs["y"], want, 1 / 16)
    print(f"channels last: {np.count_nonzero(diff)} of {diff.size} outputs differ, at most "
          f"{np.abs(diff).max()} step(s) (the BatchNormalization folded, its bias rounded)")
    assert np.abs(diff).max() <= 1
    assert not any(n.op in ("Permute", "QPermute") for n in result.graph.nodes)


def test_inspect_shows_quantizers():
    from hwonnx.inspect import format_inspection
    text = format_inspection(load_model(conv_net(15, 4, 3, pow2=False)), "m.onnx")
    assert "Quantizers (bits, signedness, scale):" in text
    assert "  c1: weights 4-bit signed narrow, arbitrary per channel scale (q_w1)" in text
    assert "  c1: output 3-bit unsigned, arbitrary per tensor scale (q_a1q)" in text
    assert "  c1: bias 32-bit signed, arbitrary per channel scale (q_b1)" in text


def test_inspect_places_a_prequantized_model_on_an_array_without_the_rounding_unit():
    """``hwonnx inspect`` plans the model as ``build`` does: layers that would round as
    onnxruntime does round half up on the default array (before, the placement failed)."""
    from hwonnx.inspect import format_placement
    text = format_placement(load_model(conv_net(15, 4, 3)), ArchConfig())
    assert "| c1 | QConv | hardware |" in text and "| g | QDense | hardware |" in text


@pytest.mark.rtl
@pytest.mark.parametrize("case", ["w4a4", "w1a1", "w6a3_signed_narrow"])
def test_rtl_equals_golden(case):
    rng = np.random.default_rng(16)
    model = conv_net(3, **EXACT[case])
    xs = rng.normal(0, 1, (4, 3, 8, 8)).astype(np.float32)
    result = api.build(model, None, calib=None, config=ORT_CONFIG, verilog=False,
                       log=lambda *_: None)
    rtl = rtl_matches_golden(result, {"x": xs}, 4)
    np.testing.assert_array_equal(rtl.outputs["y"], reference(model, xs))


def trunc_net(seed: int, rounding: str, v2: bool, pool: bool = True) -> onnx.ModelProto:
    """x -> Quant -> Conv (4-bit weights) -> Relu -> Quant (4-bit unsigned, 1/4) ->
    [AveragePool 2x2 -> Mul 4 (Brevitas' TruncAvgPool2d: the window's sum)] -> Trunc (6 to 4
    bits, or 4 to 2 without the pool) -> Flatten -> Gemm -> Quant."""
    b = Builder(np.random.default_rng(seed))
    b.quant("x", "xq", 1 / 32, 8)
    w, s_w = b.weight("w", (4, 3, 3, 3), 4)
    c = b.node("Conv", ["xq", w, b.bias("b", 4, np.float32(1 / 32) * s_w, True)], "c",
               pads=[1, 1, 1, 1])
    b.quant(b.node("Relu", [c], "r"), "a", 0.25, 4, signed=False)
    source, in_bits, size = "a", 4, 8
    if pool:
        p = b.node("AveragePool", ["a"], "p", kernel_shape=[2, 2], strides=[2, 2])
        source, in_bits, size = b.node("Mul", [p, b.const("four", 4.0)], "m"), 6, 4
    out_bits = in_bits - 2
    inputs = [source, b.const("t_s", 0.25), b.const("t_z", 0.0), b.const("t_ib", in_bits)]
    if v2:
        inputs += [b.const("t_os", 1.0), b.const("t_ob", out_bits)]
        b.nodes.append(helper.make_node("Trunc", inputs, ["t"], domain=QONNX, name="trunc",
                                        rounding_mode=rounding, signed=0, narrow=0))
    else:
        inputs.append(b.const("t_ob", out_bits))
        b.nodes.append(helper.make_node("Trunc", inputs, ["t"], domain=QONNX, name="trunc",
                                        rounding_mode=rounding))
    w2, s_w2 = b.weight("w2", (10, 4 * size * size), 8)
    t_scale = np.float32(1.0 if v2 else 0.25)
    g = b.node("Gemm", [b.node("Flatten", ["t"], "f"), w2, b.bias("b2", 10, t_scale * s_w2,
                                                                     True)], "g", transB=1)
    b.quant(g, "y", 1 / 8, 8)
    model = b.model([1, 3, 8, 8], "y", [1, 10])
    model.opset_import[1].version = 2 if v2 else 1
    return model


@pytest.mark.parametrize("rounding", ["FLOOR", "CEIL", "ROUND"])
@pytest.mark.parametrize("v2", [False, True], ids=["trunc_v1", "trunc_v2"])
@pytest.mark.parametrize("pool", [True, False], ids=["avgpool", "shift"])
def test_trunc_equals_qonnx_bit_for_bit(rounding, v2, pool):
    """Trunc as a depthwise sum requantized by exactly 2^-k with its rounding mode."""
    rng = np.random.default_rng(19)
    model = trunc_net(20, rounding, v2, pool)
    xs = rng.normal(0, 1, (SAMPLES, 3, 8, 8)).astype(np.float32)
    want = reference(model, xs)
    result, golden_result = golden(model, xs)
    np.testing.assert_array_equal(golden_result.outputs["y"], want)
    layer = next(n for n in result.graph.nodes if n.name == "trunc")
    assert layer.attrs.get("rounding") == ("ort" if rounding == "ROUND" else None)
    if v2:
        assert (layer.attrs["lo"], layer.attrs["hi"]) == (0, 2 ** (2 if pool else 0) * 4 - 1)


@pytest.mark.parametrize("v2, name, value, message", [
    (False, "t_ib", np.nan, "has input bit width [nan]; hwonnx reads one integer input bit "
                            "width from 1 to 32"),
    (True, "t_ob", np.inf, "has output bit width [inf]; hwonnx reads one integer output bit "
                           "width from 1 to 32"),
    (False, "t_s", np.nan, "has scale [nan]; scales must be positive finite floats"),
    (True, "t_os", 0.0, "has output scale [0.0]; scales must be positive finite floats"),
])
def test_trunc_parameters_that_are_not_finite_are_refused_by_name(v2, name, value, message):
    """A NaN or infinite bit width, or a NaN or zero scale, of a Trunc took a traceback
    (int() of NaN, log2 of 0)."""
    model = trunc_net(20, "FLOOR", v2)
    init = next(i for i in model.graph.initializer if i.name == name)
    init.CopyFrom(numpy_helper.from_array(np.asarray(value, np.float32), name))
    with raises(ModelError, f"Trunc 'trunc' {message}"):
        load_model(model)


@pytest.mark.rtl
@pytest.mark.parametrize("rounding, v2", [("FLOOR", False), ("CEIL", True)])
def test_trunc_rtl_equals_golden(rounding, v2):
    rng = np.random.default_rng(21)
    model = trunc_net(22, rounding, v2)
    xs = rng.normal(0, 1, (4, 3, 8, 8)).astype(np.float32)
    result = api.build(model, None, calib=None, config=ORT_CONFIG, verilog=False,
                       log=lambda *_: None)
    rtl = rtl_matches_golden(result, {"x": xs}, 4)
    np.testing.assert_array_equal(rtl.outputs["y"], reference(model, xs))


def depth_to_space_net(seed: int, mode: str) -> onnx.ModelProto:
    """x -> Quant -> Conv (8 = 2 x 2 x 2 channels) -> Quant (8-bit signed) -> DepthToSpace
    (blocksize 2) -> Relu -> Quant -> Flatten -> Gemm -> Quant, power-of-two scales."""
    b = Builder(np.random.default_rng(seed))
    b.quant("x", "xq", 1 / 32, 8)
    w, s_w = b.weight("w", (8, 3, 3, 3), 6)
    b.quant(b.node("Conv", ["xq", w, b.bias("b", 8, np.float32(1 / 32) * s_w, True)], "c",
                   pads=[1, 1, 1, 1]), "cq", 1 / 8, 8)
    d = b.node("DepthToSpace", ["cq"], "d", blocksize=2, mode=mode)
    b.quant(b.node("Relu", [d], "r"), "a", 1 / 8, 8, signed=False)
    w2, s_w2 = b.weight("w2", (10, 2 * 8 * 8), 8)
    g = b.node("Gemm", [b.node("Flatten", ["a"], "f"), w2,
                        b.bias("b2", 10, np.float32(1 / 8) * s_w2, True)], "g", transB=1)
    b.quant(g, "y", 1 / 4, 8)
    return b.model([1, 3, 4, 4], "y", [1, 10])


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_is_an_exact_copy(mode):
    rng = np.random.default_rng(23)
    model = depth_to_space_net(24, mode)
    xs = rng.normal(0, 1, (SAMPLES, 3, 4, 4)).astype(np.float32)
    result, golden_result = golden(model, xs)
    np.testing.assert_array_equal(golden_result.outputs["y"], reference(model, xs))
    layer = next(n for n in result.graph.nodes if n.name == "d")
    assert layer.op == "QConvTranspose" and layer.attrs["group"] == (2 if mode == "CRD" else 1)


@pytest.mark.rtl
def test_depth_to_space_rtl_equals_golden():
    rng = np.random.default_rng(25)
    model = depth_to_space_net(26, "CRD")
    xs = rng.normal(0, 1, (4, 3, 4, 4)).astype(np.float32)
    result = api.build(model, None, calib=None, config=ORT_CONFIG, verilog=False,
                       log=lambda *_: None)
    rtl = api.simulate(result, {"x": xs}, mode="compare", log=lambda *_: None)
    assert rtl.cycles == [rtl.predicted_cycles] * 4
    np.testing.assert_array_equal(rtl.outputs["y"], reference(model, xs))


def bipolar_net(seed: int, one_bit_quant: bool = False) -> onnx.ModelProto:
    """FINN's W1A1 style: x -> Quant (8-bit) -> Conv (bipolar weights) -> BatchNormalization
    -> BipolarQuant -> Conv (bipolar weights, float bias) -> BipolarQuant (or Brevitas' 1-bit
    signed Quant) -> Flatten -> Gemm (4-bit weights) -> Quant."""
    b = Builder(np.random.default_rng(seed))
    b.quant("x", "xq", 1 / 16, 8)
    w1, _ = b.weight("w1", (8, 3, 3, 3), 1)
    c1 = b.node("Conv", ["xq", w1], "c1", pads=[1, 1, 1, 1])
    n1 = b.node("BatchNormalization", [c1, b.const("bn_g", b.rng.uniform(0.5, 1.5, 8) * np.where(
        np.arange(8) == 3, -1, 1)), b.const("bn_b", b.rng.normal(0, 0.3, 8)),
        b.const("bn_m", b.rng.normal(0, 0.3, 8)), b.const("bn_v", b.rng.uniform(0.5, 2, 8))],
        "n1")
    b.nodes.append(helper.make_node("BipolarQuant", [n1, b.const("a1_s", 1.0)], ["a1"],
                                    domain=QONNX, name="q_a1"))
    w2, _ = b.weight("w2", (8, 8, 3, 3), 1)
    c2 = b.node("Conv", ["a1", w2, b.const("b2", b.rng.normal(0, 2, 8))], "c2",
                pads=[1, 1, 1, 1], strides=[2, 2])
    if one_bit_quant:
        b.quant(c2, "a2", 0.5, 1)
    else:
        b.nodes.append(helper.make_node("BipolarQuant", [c2, b.const("a2_s", 0.5)], ["a2"],
                                        domain=QONNX, name="q_a2"))
    w3, s_w3 = b.weight("w3", (10, 8 * 4 * 4), 4)
    g = b.node("Gemm", [b.node("Flatten", ["a2"], "f"), w3,
                        b.bias("b3", 10, np.float32(0.5) * s_w3, True)], "g", transB=1)
    b.quant(g, "y", 1 / 4, 8)
    return b.model([1, 3, 8, 8], "y", [1, 10])


@pytest.mark.parametrize("one_bit_quant", [False, True], ids=["BipolarQuant", "Quant1bit"])
def test_bipolar_activations_equal_qonnx_bit_for_bit(one_bit_quant):
    """A bipolar activation is the sign of its layer, computed exactly as an odd integer
    threshold (the float bias and a folded BatchNormalization included)."""
    rng = np.random.default_rng(27)
    model = bipolar_net(28, one_bit_quant)
    xs = rng.normal(0, 1, (32, 3, 8, 8)).astype(np.float32)
    result, golden_result = golden(model, xs)
    np.testing.assert_array_equal(golden_result.outputs["y"], reference(model, xs))
    layers = {n.name: n for n in result.graph.nodes}
    for name in ("c1", "c2"):
        assert (layers[name].attrs["lo"], layers[name].attrs["hi"]) == (-1, 1)
        assert set(np.unique(result.graph.constants[layers[name].inputs[1]])) == {-2, 2}


@pytest.mark.rtl
def test_bipolar_rtl_equals_golden():
    rng = np.random.default_rng(29)
    model = bipolar_net(30)
    xs = rng.normal(0, 1, (4, 3, 8, 8)).astype(np.float32)
    result = api.build(model, None, calib=None, config=ORT_CONFIG, verilog=False,
                       log=lambda *_: None)
    rtl = rtl_matches_golden(result, {"x": xs}, 4)
    np.testing.assert_array_equal(rtl.outputs["y"], reference(model, xs))


def test_integer_typed_input_needs_no_calibration():
    """An input that qonnx's tensor annotation declares INT4 (FINN's way of saying the input
    is already integer) is quantized with scale 1 to [-8, 7]: no calibration data, bit-exact."""
    b = Builder(np.random.default_rng(31))
    w, s_w = b.weight("w", (6, 3, 3, 3), 4)
    c = b.node("Conv", ["x", w, b.bias("b", 6, s_w, True)], "c", pads=[1, 1, 1, 1])
    b.quant(b.node("Relu", [c], "r"), "a", 1.0, 4, signed=False)
    w2, s_w2 = b.weight("w2", (10, 6 * 8 * 8), 8)
    g = b.node("Gemm", [b.node("Flatten", ["a"], "f"), w2, b.bias("b2", 10, s_w2, True)],
               "g", transB=1)
    b.quant(g, "y", 1 / 4, 8)
    model = b.model([1, 3, 8, 8], "y", [1, 10])
    model.graph.quantization_annotation.add(tensor_name="x").quant_parameter_tensor_names.add(
        key="finn_datatype", value="INT4")
    xs = np.random.default_rng(32).integers(-8, 8, (SAMPLES, 3, 8, 8)).astype(np.float32)
    result, golden_result = golden(model, xs)          # calib=None
    np.testing.assert_array_equal(golden_result.outputs["y"], reference(model, xs))
    first = next(n for n in result.graph.nodes if n.op == "Quantize")
    assert (first.attrs["scale"], first.attrs["zero_point"]) == (1.0, 0)


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_qcdq_form_equals_qonnx_bit_for_bit(per_channel):
    """qonnx's QuantToQCDQ rewrites each 2- to 8-bit Quant as QuantizeLinear -> Clip ->
    DequantizeLinear (weights too, from float): the Clip is the tensor's n-bit range."""
    from qonnx.core.modelwrapper import ModelWrapper
    from qonnx.transformation.qonnx_to_qcdq import QuantToQCDQ

    original = conv_net(34, 4, 3, per_channel=per_channel)
    qcdq = QuantToQCDQ().apply(ModelWrapper(original))
    qcdq = (qcdq[0] if isinstance(qcdq, tuple) else qcdq).model
    assert sum(n.op_type == "Clip" for n in qcdq.graph.node) >= 4
    assert sum(n.op_type == "Quant" for n in qcdq.graph.node) == 3     # the 32-bit biases
    xs = np.random.default_rng(35).normal(0, 1, (SAMPLES, 3, 8, 8)).astype(np.float32)
    result, golden_result = golden(qcdq, xs)
    np.testing.assert_array_equal(golden_result.outputs["y"], reference(original, xs))
    layers = {n.name: n for n in result.graph.nodes if n.op == "QConv"}
    for layer in layers.values():   # 3-bit unsigned, as uint8 [0, 7]: int8 [-128, -121]
        assert (layer.attrs["lo"], layer.attrs["hi"]) == (layer.attrs["out_zp"],
                                                          layer.attrs["out_zp"] + 7)


def test_quantizer_parameters_from_constant_nodes():
    """Scales, zero points and bit widths written as Constant nodes, not initializers."""
    model = conv_net(36, 4, 4)
    params = [i for i in model.graph.initializer if i.name.endswith(("_s", "_z", "_b"))]
    for init in params:
        model.graph.node.insert(0, helper.make_node("Constant", [], [init.name], value=init,
                                                    name=f"const_{init.name}"))
        model.graph.initializer.remove(init)
    xs = np.random.default_rng(37).normal(0, 1, (4, 3, 8, 8)).astype(np.float32)
    _, result = golden(model, xs)
    np.testing.assert_array_equal(result.outputs["y"], reference(conv_net(36, 4, 4), xs))
