"""QONNX imports that were refused before issue #36 item 9 and that exporters write: a
``BipolarQuant`` on the graph input (a binary first layer), an input quantizer of fewer than
8 bits, a tensor quantized twice with different scales, ``Resize`` on a channels-last tensor,
and a Brevitas QCDQ export whose ``BatchNormalization`` follows a layer with integer weights.

Each is compared with qonnx's reference executor (``execute_onnx``), which defines the QONNX
semantics: bit for bit where the arithmetic is exact (power-of-two scales, integer biases),
within the stated bound otherwise; and on the RTL, equal to golden bit for bit in the
predicted cycles."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from hwonnx import api
from hwonnx.errors import ModelError, QuantizationError
from hwonnx.frontend import load_model
from helpers import raises
from qonnx_helpers import (ORT_CONFIG, QONNX, SAMPLES, Builder, golden, reference,
                           steps)
from rtl_helpers import rtl_matches_golden

F = TensorProto.FLOAT


def _head(b: Builder, x: str, channels: int, size: int, s_x) -> str:
    """Flatten -> Gemm (8-bit weights, Int32 bias) -> Quant (8-bit signed, 1/4): ``y``."""
    w, s_w = b.weight("wg", (10, channels * size * size), 8)
    g = b.node("Gemm", [b.node("Flatten", [x], "f"), w,
                        b.bias("bg", 10, np.float32(s_x) * s_w, True)], "g", transB=1)
    return b.quant(g, "y", 1 / 4, 8)


def _first_conv(b: Builder, channels: int) -> str:
    """Quant of ``x`` (8-bit signed, 1/32) -> 3x3 Conv ``c1`` of ``channels`` outputs (4-bit
    weights, Int32 bias, padding 1): its output."""
    b.quant("x", "xq", 1 / 32, 8)
    w, s_w = b.weight("w1", (channels, 3, 3, 3), 4)
    return b.node("Conv", ["xq", w, b.bias("b1", channels, np.float32(1 / 32) * s_w, True)],
                  "c1", pads=[1, 1, 1, 1])


def _build(model):
    return api.build(model, None, calib=None, config=ORT_CONFIG, verilog=False,
                     log=lambda *_: None)


# -- (a) a BipolarQuant on the graph input ------------------------------------------------

def bipolar_input_net(seed: int, binary_hidden: bool, quant_1bit: bool = False):
    """x -> BipolarQuant (scale 2; or Brevitas' 1-bit signed Quant) -> Conv 3x3 (bipolar
    weights, no bias) -> [Relu -> Quant (4-bit unsigned) | BatchNormalization -> BipolarQuant
    (the layer's sign)] -> Flatten -> Gemm -> Quant: FINN's binary first layer."""
    b = Builder(np.random.default_rng(seed))
    if quant_1bit:
        b.quant("x", "xq", 2.0, 1)
    else:
        b.nodes.append(helper.make_node("BipolarQuant", ["x", b.const("xq_s", 2.0)], ["xq"],
                                        domain=QONNX, name="q_xq"))
    w, _ = b.weight("w1", (6, 3, 3, 3), 1)
    c = b.node("Conv", ["xq", w], "c1", pads=[1, 1, 1, 1])
    if binary_hidden:
        n = b.node("BatchNormalization", [c, b.const("bn_g", b.rng.uniform(0.5, 1.5, 6)),
                                          b.const("bn_b", b.rng.normal(0, 0.3, 6)),
                                          b.const("bn_m", b.rng.normal(0, 0.3, 6)),
                                          b.const("bn_v", b.rng.uniform(0.5, 2, 6))], "n1")
        b.nodes.append(helper.make_node("BipolarQuant", [n, b.const("a1_s", 1.0)], ["a1"],
                                        domain=QONNX, name="q_a1"))
        s_a = 1.0
    else:
        s_a = 0.25
        b.quant(b.node("Relu", [c], "r1"), "a1", s_a, 4, signed=False)
    _head(b, "a1", 6, 8, s_a)
    return b.model([1, 3, 8, 8], "y", [1, 10])


def _bipolar_inputs(rng, count: int) -> np.ndarray:
    """Normal inputs with exact zeros of both signs (BipolarQuant: x >= 0 gives +1, so 0.0
    and -0.0 give +1) and values just below 0 (the smallest denormal: divided by the 1-bit
    Quant's scale 2 it is -0.0, so +1 there, -1 for BipolarQuant)."""
    xs = rng.normal(0, 1, (count, 3, 8, 8)).astype(np.float32)
    flat = xs.reshape(-1)
    flat[::7], flat[1::11] = 0.0, -0.0
    flat[2::13] = -np.float32(1e-38)
    flat[3::17] = -np.finfo(np.float32).smallest_subnormal
    return xs


@pytest.mark.parametrize("binary_hidden, quant_1bit", [(False, False), (True, False),
                                                       (False, True)],
                         ids=["a4", "a1", "a4_quant_1bit"])
def test_bipolar_input_equals_qonnx_bit_for_bit(binary_hidden, quant_1bit):
    """The host quantizes the input to its sign (``Quantize`` ``sign="x"``, or ``"x/scale"``
    for the 1-bit Quant, which qonnx computes on ``x / scale``); the integer arithmetic after
    it is exact (bipolar weights of power-of-two scale), so the outputs are qonnx's bit for
    bit (0 LSB)."""
    model = bipolar_input_net(40, binary_hidden, quant_1bit)
    xs = _bipolar_inputs(np.random.default_rng(41), 16)
    result, golden_result = golden(model, xs)
    np.testing.assert_array_equal(golden_result.outputs["y"], reference(model, xs))
    first = next(n for n in result.graph.nodes if n.op == "Quantize")
    mode = "x/scale" if quant_1bit else "x"
    assert (first.attrs["sign"], first.attrs["scale"], first.attrs["zero_point"],
            first.attrs["lo"], first.attrs["hi"]) == (mode, 2.0, 0, -1, 1)
    q = api.quantize_inputs(result.graph, result.program, {"x": xs})[first.outputs[0]]
    test = xs / np.float32(2) if quant_1bit else xs
    np.testing.assert_array_equal(q, np.where(test >= 0, 1, -1).astype(np.int8))
    assert np.count_nonzero((xs >= 0) != (test >= 0)) == len(range(3, xs.size, 17)) * quant_1bit


@pytest.mark.rtl
def test_bipolar_input_rtl_equals_golden():
    model = bipolar_input_net(42, True)
    xs = _bipolar_inputs(np.random.default_rng(43), 4)
    rtl = rtl_matches_golden(_build(model), {"x": xs}, 4)
    np.testing.assert_array_equal(rtl.outputs["y"], reference(model, xs))


def test_bipolar_tensor_an_accelerator_layer_writes_is_refused_by_name():
    """A BipolarQuant of a layer's output that is not that layer's sign (a MaxPool between) is
    neither an input nor a threshold: one line naming the quantizer and the layer."""
    b = Builder(np.random.default_rng(44))
    c = _first_conv(b, 6)
    b.quant(c, "c1q", 1 / 8, 8)
    b.node("MaxPool", ["c1q"], "p1", kernel_shape=[2, 2], strides=[2, 2])
    b.nodes.append(helper.make_node("BipolarQuant", ["p1", b.const("a1_s", 1.0)], ["a1"],
                                    domain=QONNX, name="q_a1"))
    _head(b, "a1", 6, 4, 1.0)
    with raises(QuantizationError, "Node 'q_a1' quantizes 'p1' to ±1 by its sign, but 'p1' is "
                                   "computed by 'p1' (QMaxPool) on the accelerator; hwonnx maps a "
                                   "bipolar tensor as an input the host quantizes or as the sign "
                                   "of a Conv or Gemm with quantized weights"):
        golden(b.model([1, 3, 8, 8], "y", [1, 10]), np.zeros((1, 3, 8, 8), np.float32))


# -- (b) an input quantizer of fewer than 8 bits ------------------------------------------

NARROW_INPUTS = {          # bits, signed, narrow, scale
    "int4": (4, True, False, 1 / 4),
    "uint3": (3, False, False, 1 / 2),
    "int5_narrow": (5, True, True, 1 / 8),
    "uint7_narrow": (7, False, True, 1 / 32),
}


def narrow_input_net(seed: int, bits: int, signed: bool, narrow: bool, s_x: float):
    """x -> Quant (``bits``) -> Conv 3x3 (4-bit weights, Int32 bias) -> Relu -> Quant (4-bit
    unsigned) -> Flatten -> Gemm -> Quant."""
    b = Builder(np.random.default_rng(seed))
    b.quant("x", "xq", s_x, bits, signed=signed, narrow=narrow)
    w, s_w = b.weight("w1", (6, 3, 3, 3), 4)
    c = b.node("Conv", ["xq", w, b.bias("b1", 6, np.float32(s_x) * s_w, True)], "c1",
               pads=[1, 1, 1, 1])
    b.quant(b.node("Relu", [c], "r1"), "a1", 0.5, 4, signed=False)
    _head(b, "a1", 6, 8, 0.5)
    return b.model([1, 3, 8, 8], "y", [1, 10])


@pytest.mark.parametrize("case", sorted(NARROW_INPUTS))
def test_narrow_input_quantizer_equals_qonnx_bit_for_bit(case):
    """The host clamps the input to the quantizer's range (``Quantize`` ``lo``/``hi``: each
    range fits int8 with zero point 0); every input value saturates somewhere (normal
    values times 4 against ranges of at most 2 to 4 real units), and the outputs are qonnx's
    bit for bit (0 LSB: power-of-two scales, integer biases)."""
    bits, signed, narrow, s_x = NARROW_INPUTS[case]
    model = narrow_input_net(45, *NARROW_INPUTS[case])
    xs = np.random.default_rng(46).normal(0, 4, (SAMPLES, 3, 8, 8)).astype(np.float32)
    result, golden_result = golden(model, xs)
    np.testing.assert_array_equal(golden_result.outputs["y"], reference(model, xs))
    first = next(n for n in result.graph.nodes if n.op == "Quantize")
    lo = -(2 ** (bits - 1)) + narrow if signed else 0
    hi = 2 ** (bits - 1) - 1 if signed else 2 ** bits - 1 - narrow
    assert (first.attrs["lo"], first.attrs["hi"], first.attrs["zero_point"]) == (lo, hi, 0)
    q = api.quantize_inputs(result.graph, result.program, {"x": xs})[first.outputs[0]]
    assert (q.min(), q.max()) == (lo, hi)           # both ends reached


@pytest.mark.rtl
def test_narrow_input_rtl_equals_golden():
    model = narrow_input_net(47, *NARROW_INPUTS["uint3"])
    xs = np.random.default_rng(48).normal(0, 4, (4, 3, 8, 8)).astype(np.float32)
    rtl = rtl_matches_golden(_build(model), {"x": xs}, 4)
    np.testing.assert_array_equal(rtl.outputs["y"], reference(model, xs))


# -- (d) a tensor quantized twice ----------------------------------------------------------

def double_quant_net(seed: int, pow2: bool):
    """x -> Quant (8-bit) -> Quant (5-bit, another scale) -> Conv 3x3 (4-bit weights) ->
    Relu -> Quant (8-bit unsigned) -> Quant (4-bit unsigned) -> Flatten -> Gemm -> Quant
    (8-bit) -> Quant (4-bit signed narrow) = y: each second Quant reads the first's output, on
    an input, a [1, C, H, W] feature map and a [1, C] vector (Brevitas' QuantIdentity after a
    quantized activation)."""
    b = Builder(np.random.default_rng(seed), pow2=pow2)
    s_x, s_x2 = b.scale(1 / 32 if pow2 else 0.0297), b.scale(1 / 8 if pow2 else 0.1113)
    b.quant("x", "x8", s_x, 8)
    b.quant("x8", "x5", s_x2, 5)
    w, s_w = b.weight("w1", (6, 3, 3, 3), 4)
    c = b.node("Conv", ["x5", w, b.bias("b1", 6, s_x2 * s_w, True)], "c1", pads=[1, 1, 1, 1])
    s_a, s_a2 = b.scale(1 / 16 if pow2 else 0.0731), b.scale(1 / 4 if pow2 else 0.2207)
    b.quant(b.node("Relu", [c], "r1"), "a8", s_a, 8, signed=False)
    b.quant("a8", "a4", s_a2, 4, signed=False)
    w2, s_w2 = b.weight("w2", (10, 6 * 8 * 8), 8)
    g = b.node("Gemm", [b.node("Flatten", ["a4"], "f"), w2,
                        b.bias("b2", 10, s_a2 * s_w2, True)], "g", transB=1)
    s_g, s_y = b.scale(1 / 8 if pow2 else 0.1379), b.scale(1 / 2 if pow2 else 0.4413)
    b.quant(g, "g8", s_g, 8)
    b.quant("g8", "y", s_y, 4, narrow=True)
    return b.model([1, 3, 8, 8], "y", [1, 10]), float(s_y)


def test_tensor_quantized_twice_equals_qonnx_bit_for_bit():
    """Each second quantizer reads a copy of the tensor requantized on the array (a depthwise
    1x1 layer of weights 1, multiplier ``s1 / s2``, clamped to the second range): with
    power-of-two scales the product is exact and ROUND is the rounding unit's half to even,
    so the outputs are qonnx's bit for bit (0 LSB)."""
    model, _ = double_quant_net(50, True)
    xs = np.random.default_rng(51).normal(0, 2, (32, 3, 8, 8)).astype(np.float32)
    result, golden_result = golden(model, xs)
    np.testing.assert_array_equal(golden_result.outputs["y"], reference(model, xs))
    copies = [n for n in result.graph.nodes if n.op == "QConv" and "requantized" in n.name]
    assert sorted((n.attrs["in_scale"], n.attrs["out_scale"], n.attrs["lo"], n.attrs["hi"])
                  for n in copies) == [(1 / 32, 1 / 8, -16, 15), (1 / 16, 1 / 4, 0, 15),
                                       (1 / 8, 1 / 2, -7, 7)]
    assert all(n.attrs["rounding"] == "ort" for n in copies)


def test_tensor_quantized_twice_with_arbitrary_scales_within_one_step():
    """Arbitrary scales: hwonnx multiplies the integer by float32 ``s1 / s2`` and rounds once
    more; qonnx rounds ``q1 * s1`` to float32 and divides by ``s2``. The two differ only where
    ``q1 * s1 / s2`` is within float32's rounding of a tie: at most one step of a requantized
    tensor, which can move a later layer's output by a step too (bound: 1 step at y)."""
    model, s_y = double_quant_net(52, False)
    xs = np.random.default_rng(53).normal(0, 2, (64, 3, 8, 8)).astype(np.float32)
    _, golden_result = golden(model, xs)
    diff = steps(golden_result.outputs["y"], reference(model, xs), s_y)
    print(f"quantized twice, arbitrary scales: {np.count_nonzero(diff)} of {diff.size} "
          f"outputs differ from qonnx, by at most {np.abs(diff).max()} step")
    assert np.abs(diff).max() <= 1
    assert np.count_nonzero(diff) <= diff.size // 20


@pytest.mark.parametrize("between", ["MaxPool", "Flatten"])
def test_tensor_quantized_twice_through_a_grid_keeping_op_equals_qonnx(between):
    """Quant -> MaxPool or Flatten -> Quant of another scale: the copy is made after the
    MaxPool (which keeps the first grid: the rounding unit, not the pool's half-up
    requantization, rounds) and before the Flatten (a 4-D copy; a flattened image cannot be
    reshaped back to one). 0 LSB."""
    b = Builder(np.random.default_rng(57))
    c = _first_conv(b, 6)
    b.quant(b.node("Relu", [c], "r1"), "a8", 1 / 16, 8, signed=False)
    if between == "MaxPool":
        b.node("MaxPool", ["a8"], "p", kernel_shape=[2, 2], strides=[2, 2])
        b.quant("p", "a4", 1 / 4, 4, signed=False)
        _head(b, "a4", 6, 4, 1 / 4)
    else:
        b.quant(b.node("Flatten", ["a8"], "p"), "a4", 1 / 4, 4, signed=False)
        w2, s_w2 = b.weight("wg", (10, 6 * 8 * 8), 8)
        b.quant(b.node("Gemm", ["a4", w2, b.bias("bg", 10, np.float32(1 / 4) * s_w2, True)],
                       "g", transB=1), "y", 1 / 4, 8)
    model = b.model([1, 3, 8, 8], "y", [1, 10])
    xs = np.random.default_rng(58).normal(0, 2, (32, 3, 8, 8)).astype(np.float32)
    result, golden_result = golden(model, xs)
    np.testing.assert_array_equal(golden_result.outputs["y"], reference(model, xs))
    ops = [n.op for n in result.graph.nodes]
    assert ops[ops.index("QConv") + 1:ops.index("QDense")] == (
        ["QMaxPool", "QConv", "Flatten"] if between == "MaxPool" else ["QConv", "Flatten"])


def test_tensor_quantized_twice_alike_needs_no_copy():
    """A second quantizer equal to the first (operator, attributes, parameters) changes no
    value on the first's grid: no copy layer, and still qonnx's outputs bit for bit."""
    b = Builder(np.random.default_rng(59))
    c = _first_conv(b, 6)
    b.quant(b.node("Relu", [c], "r1"), "a1", 1 / 4, 4, signed=False)
    b.nodes.append(helper.make_node("Quant", ["a1", "a1_s", "a1_z", "a1_b"], ["a2"],
                                    domain=QONNX, name="q_a2", signed=0, narrow=0,
                                    rounding_mode="ROUND"))
    _head(b, "a2", 6, 8, 1 / 4)
    model = b.model([1, 3, 8, 8], "y", [1, 10])
    xs = np.random.default_rng(60).normal(0, 2, (SAMPLES, 3, 8, 8)).astype(np.float32)
    result, golden_result = golden(model, xs)
    np.testing.assert_array_equal(golden_result.outputs["y"], reference(model, xs))
    assert [n.op for n in result.graph.nodes] == ["Quantize", "QConv", "Flatten", "QDense",
                                                  "Dequantize"]


@pytest.mark.rtl
def test_tensor_quantized_twice_rtl_equals_golden():
    model, _ = double_quant_net(54, True)
    xs = np.random.default_rng(55).normal(0, 2, (4, 3, 8, 8)).astype(np.float32)
    rtl = rtl_matches_golden(_build(model), {"x": xs}, 4)
    np.testing.assert_array_equal(rtl.outputs["y"], reference(model, xs))


def test_bipolar_quantizer_of_a_quantized_tensor_is_refused_by_name():
    b = Builder(np.random.default_rng(56))
    b.quant("x", "xq", 1 / 32, 8)
    b.nodes.append(helper.make_node("BipolarQuant", ["xq", b.const("xb_s", 1.0)], ["xb"],
                                    domain=QONNX, name="q_xb"))
    w, _ = b.weight("w1", (6, 3, 3, 3), 1)
    b.quant(b.node("Relu", [b.node("Conv", ["xb", w], "c1", pads=[1, 1, 1, 1])], "r1"), "a1",
            1.0, 4, signed=False)
    _head(b, "a1", 6, 8, 1.0)
    with raises(ModelError, "BipolarQuant 'q_xb' quantizes 'xq', which Quant 'q_xq' already "
                            "quantizes, to ±1; hwonnx maps a bipolar tensor as an input the host "
                            "quantizes or as the sign of a Conv or Gemm with quantized weights"):
        load_model(b.model([1, 3, 8, 8], "y", [1, 10]))


# -- (c) Resize on a channels-last tensor --------------------------------------------------

def resize_nhwc_net(seed: int, layout: str):
    """A nearest ``Resize`` x2 (scales ``[1, 2, 2, 1]``) of a channels-last ``[1, H, W, C]``
    tensor, as exporters write it. ``transposes``: Conv -> Quant -> Transpose to NHWC ->
    Resize -> Transpose back -> Conv (PyTorch code around a channels-last upsampling);
    ``flatten``: Conv -> Quant -> Transpose to NHWC -> Resize -> Flatten -> Gemm (Keras'
    order); ``input``: an NHWC graph input -> Quant -> Resize -> Transpose to NCHW -> Conv."""
    b = Builder(np.random.default_rng(seed))
    b.inits["roi"] = np.zeros(0, np.float32)
    modes = {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"} \
        if layout == "flatten" else {}
    if layout == "input":
        b.quant("x", "a1", 1 / 16, 8)
        nhwc = "a1"
    else:
        c = _first_conv(b, 4)
        b.quant(b.node("Relu", [c], "r1"), "a1", 1 / 16, 8, signed=False)
        nhwc = b.node("Transpose", ["a1"], "t1", perm=[0, 2, 3, 1])
    up = b.node("Resize", [nhwc, "roi", b.const("scales", [1, 2, 2, 1])], "rs",
                mode="nearest", **modes)
    if layout == "flatten":
        w2, s_w2 = b.weight("wg", (10, 4 * 8 * 8), 8)
        g = b.node("Gemm", [b.node("Flatten", [up], "f"), w2,
                            b.bias("bg", 10, np.float32(1 / 16) * s_w2, True)], "g", transB=1)
        b.quant(g, "y", 1 / 4, 8)
    else:
        channels = 3 if layout == "input" else 4
        nchw = b.node("Transpose", [up], "t2", perm=[0, 3, 1, 2])
        w2, s_w2 = b.weight("w2", (4, channels, 3, 3), 4)
        c2 = b.node("Conv", [nchw, w2, b.bias("b2", 4, np.float32(1 / 16) * s_w2, True)], "c2",
                    pads=[1, 1, 1, 1], strides=[2, 2])
        b.quant(b.node("Relu", [c2], "r2"), "a2", 1 / 8, 8, signed=False)
        _head(b, "a2", 4, 4, 1 / 8)
    in_shape = [1, 4, 4, 3] if layout == "input" else [1, 3, 4, 4]
    return b.model(in_shape, "y", [1, 10]), in_shape


@pytest.mark.parametrize("layout", ["transposes", "flatten", "input"])
def test_resize_on_channels_last_equals_qonnx_bit_for_bit(layout):
    """The upsampling is the NCHW copy between two Permutes, which cancel against the
    exporter's Transposes (or fold into the Gemm's weight rows, which keep the model's
    integers); an NHWC graph input keeps its Permute, a copy on the array. The copies keep
    the model's grid, so every layer uses the model's parameters and rounding. Nearest
    upsampling copies integers: 0 LSB."""
    model, in_shape = resize_nhwc_net(60, layout)
    xs = np.random.default_rng(61).normal(0, 1, (SAMPLES, *in_shape[1:])).astype(np.float32)
    result, golden_result = golden(model, xs)
    np.testing.assert_array_equal(golden_result.outputs["y"], reference(model, xs))
    ops = [n.op for n in result.graph.nodes]
    assert ops.count("QConvTranspose") == 1
    assert ops.count("QPermute") == (1 if layout == "input" else 0)
    # the Gemm's rows moved with the folded Permute keep the model's integers
    assert not any("carry no usable integers" in note for note in result.graph.meta["notes"])
    assert all(n.attrs.get("rounding") == "ort" for n in result.graph.nodes
               if n.op in ("QConv", "QDense"))


@pytest.mark.rtl
def test_resize_on_channels_last_rtl_equals_golden():
    model, in_shape = resize_nhwc_net(62, "input")
    xs = np.random.default_rng(63).normal(0, 1, (4, *in_shape[1:])).astype(np.float32)
    rtl = rtl_matches_golden(_build(model), {"x": xs}, 4)
    np.testing.assert_array_equal(rtl.outputs["y"], reference(model, xs))


# -- (e) Brevitas' QCDQ export: the integers it holds, a BatchNormalization after them ---------

def qcdq_net(seed: int, channels: int = 6):
    """Brevitas' ``export_onnx_qcdq`` form: x -> QuantizeLinear -> DequantizeLinear (8-bit
    input) -> Conv (int8 weights in [-7, 7] -> Clip -> DequantizeLinear, per-tensor scale;
    int32 bias -> DequantizeLinear) -> BatchNormalization (float, one negative gamma) -> Relu
    -> QuantizeLinear (uint8) -> Clip [0, 15] -> DequantizeLinear = y: a 4-bit activation of
    arbitrary scales."""
    rng = np.random.default_rng(seed)
    s_x, s_w, s_y = np.float32(0.0213), np.float32(0.0371), np.float32(0.0917)
    q_w = rng.integers(-7, 8, (channels, 3, 3, 3)).astype(np.int8)
    q_b = rng.integers(-300, 300, channels).astype(np.int32)
    gamma = rng.uniform(0.5, 1.5, channels) * np.where(np.arange(channels) == 1, -1, 1)
    inits = {"s_x": s_x, "z_x": np.int8(0), "q_w": q_w, "w_lo": np.int8(-7), "w_hi": np.int8(7),
             "s_w": s_w, "z_w": np.int8(0), "q_b": q_b, "s_b": np.float32(s_x * s_w),
             "z_b": np.int32(0), "bn_g": gamma, "bn_b": rng.normal(0, 0.3, channels),
             "bn_m": rng.normal(0, 0.3, channels), "bn_v": rng.uniform(0.5, 2, channels),
             "s_y": s_y, "z_y": np.uint8(0), "y_lo": np.uint8(0), "y_hi": np.uint8(15)}
    node = helper.make_node
    nodes = [node("QuantizeLinear", ["x", "s_x", "z_x"], ["xq"], name="in_q"),
             node("DequantizeLinear", ["xq", "s_x", "z_x"], ["xd"], name="in_dq"),
             node("Clip", ["q_w", "w_lo", "w_hi"], ["w_c"], name="w_clip"),
             node("DequantizeLinear", ["w_c", "s_w", "z_w"], ["w"], name="w_dq"),
             node("DequantizeLinear", ["q_b", "s_b", "z_b"], ["b"], name="b_dq"),
             node("Conv", ["xd", "w", "b"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
             node("BatchNormalization", ["c", "bn_g", "bn_b", "bn_m", "bn_v"], ["n"],
                  name="bn1", epsilon=1e-5),
             node("Relu", ["n"], ["r"], name="relu1"),
             node("QuantizeLinear", ["r", "s_y", "z_y"], ["yq"], name="out_q"),
             node("Clip", ["yq", "y_lo", "y_hi"], ["yc"], name="out_clip"),
             node("DequantizeLinear", ["yc", "s_y", "z_y"], ["y"], name="out_dq")]
    graph = helper.make_graph(
        nodes, "qcdq", [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", F, [1, channels, 8, 8])],
        [numpy_helper.from_array(np.asarray(v, np.float32) if np.asarray(v).dtype == np.float64
                                 else np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    a = gamma / np.sqrt(inits["bn_v"].astype(np.float32).astype(np.float64) + 1e-5)
    return model, q_w, a, float(s_y)


def test_qcdq_batchnorm_keeps_the_exports_integer_weights():
    """The BatchNormalization after the Conv is folded into its weight scales (``|a| s_w``
    per channel) and bias; the weights stay the export's integers (times ``sign(a)``, held
    as multiples of 16 for the float bias' finer grid), not requantized from the folded
    float weights. Against onnxruntime's reference path (float BatchNormalization): the
    folded bias rounds to the accumulator grid and the multiplier is float32, so a value
    within that rounding of a tie can differ: at most one step of the 4-bit output."""
    from ort_reference import reference_outputs

    model, q_w, a, s_y = qcdq_net(70)
    xs = np.random.default_rng(71).normal(0, 1, (SAMPLES, 3, 8, 8)).astype(np.float32)
    result, golden_result = golden(model, xs)
    layer = next(n for n in result.graph.nodes if n.name == "conv1")
    w = result.graph.constants[layer.inputs[1]]
    np.testing.assert_array_equal(w, q_w * np.sign(a).reshape(-1, 1, 1, 1) * 16)
    assert layer.attrs["rounding"] == "ort"
    want = reference_outputs(model, {"x": xs})[0]
    diff = steps(golden_result.outputs["y"], want, s_y)
    print(f"QCDQ Conv + BatchNorm: {np.count_nonzero(diff)} of {diff.size} outputs differ "
          f"from onnxruntime's reference path, by at most {np.abs(diff).max()} step")
    assert np.abs(diff).max() <= 1
    assert np.count_nonzero(diff) <= diff.size // 100


@pytest.mark.rtl
def test_qcdq_batchnorm_rtl_equals_golden():
    model, _, _, _ = qcdq_net(72)
    xs = np.random.default_rng(73).normal(0, 1, (4, 3, 8, 8)).astype(np.float32)
    rtl_matches_golden(_build(model), {"x": xs}, 4)
