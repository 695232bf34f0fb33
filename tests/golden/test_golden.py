"""The golden integer ops against independent references: exact Python integer arithmetic for
``requantize``, onnxruntime for ``quantize`` (QuantizeLinear) and for the float meaning of
``qconv``/``qdense``."""

import math
from fractions import Fraction

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from hwonnx.golden import dequantize, qconv, qdense, quantize, requantize
from ort_reference import reference_session

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
SHIFT_EDGES = (1, 2, 30, 31, 32, 33, 62, 63)
MULT_EDGES = (1 << 30, (1 << 30) + 1, (1 << 31) - 2, (1 << 31) - 1)


# Independent references ----------------------------------------------------------------------

def ref_requantize(acc: int, bias: int, mult: int, shift: int, zp: int, lo: int, hi: int) -> int:
    """``clamp(floor(wrap32(acc + bias) * mult / 2**shift + 1/2) + zp, lo, hi)``, exactly."""
    v = (acc + bias + (1 << 31)) % (1 << 32) - (1 << 31)
    y = math.floor(Fraction(v * mult, 1 << shift) + Fraction(1, 2))
    return min(max(y + zp, lo), hi)


def ref_requantize_array(acc, bias, mult, shift, zp, lo, hi) -> np.ndarray:
    out = np.empty(acc.shape, dtype=np.int64)
    for index in np.ndindex(acc.shape):
        c = index[-1]
        out[index] = ref_requantize(int(acc[index]), int(bias[c]), int(mult[c]), int(shift[c]),
                                    zp, lo, hi)
    return out


def exact_multiplier(real: float) -> "tuple[int, int]":
    """``(mult, shift)`` with ``mult`` in [2**30, 2**31) nearest to ``real * 2**shift``."""
    shift = 30 - math.floor(math.log2(real))
    mult = round(Fraction(real) * (1 << shift))
    if mult == 1 << 31:
        mult, shift = 1 << 30, shift - 1
    assert (1 << 30) <= mult < (1 << 31) and 1 <= shift <= 63
    return mult, shift


def run_ort(nodes, inputs, outputs, inits, feeds, opset=17):
    graph = helper.make_graph(
        nodes, "ref",
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", opset)])
    return reference_session(model).run(None, feeds)[0]


def float_requantize(y_real: np.ndarray, out_scale: float, out_zp: int, lo: int, hi: int
                     ) -> np.ndarray:
    """Requantize in float: round half up of the real value in output units."""
    return np.clip(np.floor(y_real.astype(np.float64) / out_scale + 0.5) + out_zp, lo, hi)


# requantize -------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_requantize_matches_exact_integer_reference(seed):
    rng = np.random.default_rng(seed)
    channels = 16
    mult = rng.integers(1 << 30, 1 << 31, channels, dtype=np.int64)
    shift = rng.integers(1, 64, channels, dtype=np.int64)
    mult[:len(MULT_EDGES)] = MULT_EDGES
    shift[:len(SHIFT_EDGES)] = SHIFT_EDGES
    rng.shuffle(shift)
    acc = rng.integers(INT32_MIN, INT32_MAX, (40, channels), endpoint=True, dtype=np.int64)
    acc[0], acc[1], acc[2], acc[3] = INT32_MIN, INT32_MAX, 0, -1
    bias = rng.integers(INT32_MIN, INT32_MAX, channels, endpoint=True, dtype=np.int64)
    zp = int(rng.integers(-128, 128))
    got = requantize(acc.astype(np.int32), bias.astype(np.int32), mult.astype(np.int32),
                     shift.astype(np.int32), zp, -128, 127)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, ref_requantize_array(acc, bias, mult, shift, zp, -128,
                                                            127))


@pytest.mark.parametrize("relu", [False, True])
def test_requantize_unsaturated_range_wrap_and_clamp(relu):
    """Shifts chosen so that most outputs land inside int8, with acc + bias overflowing int32
    for a good share of them: exercises rounding, the wrap-around and both clamps."""
    rng = np.random.default_rng(11 + relu)
    channels = 8
    mult = rng.integers(1 << 30, 1 << 31, channels, dtype=np.int64)
    shift = rng.integers(53, 60, channels, dtype=np.int64)
    acc = rng.integers(INT32_MIN, INT32_MAX, (500, channels), endpoint=True, dtype=np.int64)
    bias = rng.integers(INT32_MIN // 2, INT32_MAX // 2, channels, dtype=np.int64)
    zp = -20
    lo = zp if relu else -128
    got = requantize(acc.astype(np.int32), bias.astype(np.int32), mult.astype(np.int32),
                     shift.astype(np.int32), zp, lo, 127)
    want = ref_requantize_array(acc, bias, mult, shift, zp, lo, 127)
    np.testing.assert_array_equal(got, want)
    wrapped = ((acc + bias) < INT32_MIN) | ((acc + bias) > INT32_MAX)
    assert wrapped.sum() > 50
    assert ((want > lo) & (want < 127)).sum() > 1000
    assert (want == lo).any() and (want == 127).any()
    if relu:
        assert got.min() == zp


def test_requantize_int32_wrap_of_acc_plus_bias():
    # INT32_MAX + 1 wraps to INT32_MIN: -2**31 * 2**30 / 2**62 = -0.5 rounds (half up) to 0;
    # without the wrap it would be +0.5 -> 1.
    one = np.ones(1, dtype=np.int32)
    got = requantize(np.array([[INT32_MAX]], np.int32), one, np.array([1 << 30], np.int32),
                     np.array([62], np.int32), 0, -128, 127)
    np.testing.assert_array_equal(got, [[0]])
    got = requantize(np.array([[INT32_MIN]], np.int32), -one, np.array([1 << 30], np.int32),
                     np.array([61], np.int32), 0, -128, 127)
    np.testing.assert_array_equal(got, [[1]])      # wraps to INT32_MAX: 2**31-1 over 2**31


def test_requantize_rounds_ties_half_up():
    acc = np.array([[-7, -5, -3, -1, 1, 3, 5, 7]], dtype=np.int32).T     # halves
    ones = np.ones(1, dtype=np.int32)
    got = requantize(acc, 0 * ones, np.array([1 << 30], np.int32), ones * 31, 0, -128, 127)
    np.testing.assert_array_equal(got[:, 0], [-3, -2, -1, 0, 1, 2, 3, 4])


# quantize ----------------------------------------------------------------------------------------

def ort_quantize_linear(x: np.ndarray, scale: float, zp: int) -> np.ndarray:
    return run_ort([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])],
                   {"x": (TensorProto.FLOAT, list(x.shape))},
                   {"y": (TensorProto.INT8, list(x.shape))},
                   {"s": np.array(scale, np.float32), "z": np.array(zp, np.int8)}, {"x": x})


@pytest.mark.parametrize("scale, zp", [(0.25, 3), (0.5, -128), (0.0371, 10),
                                       (1 / 255, -128), (0.013, 127), (3.7, 0)])
def test_quantize_equals_onnx_quantize_linear(scale, zp):
    rng = np.random.default_rng(abs(zp) + round(1000 * scale))
    random = rng.uniform(-300 * scale, 300 * scale, 3000)
    ties = (np.arange(-300, 300) + 0.5) * scale          # exact .5 for power-of-two scales
    x = np.concatenate([random, ties, [0.0, -0.0, 1e30, -1e30]]).astype(np.float32)
    got = quantize(x, scale=scale, zero_point=zp)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, ort_quantize_linear(x, scale, zp))
    assert got.min() == -128 and got.max() == 127        # saturation was exercised


def test_quantize_rounds_half_to_even():
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5], dtype=np.float32)
    np.testing.assert_array_equal(quantize(x, scale=1.0, zero_point=0), [-2, -2, 0, 0, 2, 2])


def test_dequantize_inverts_quantize_within_half_a_step():
    rng = np.random.default_rng(5)
    scale, zp = 0.05, -7
    x = rng.uniform((-128 - zp) * scale, (127 - zp) * scale, 1000).astype(np.float32)
    back = dequantize(quantize(x, scale=scale, zero_point=zp), scale=scale, zero_point=zp)
    assert back.dtype == np.float32
    assert np.abs(back - x).max() <= scale / 2 * (1 + 1e-5)


# qconv / qdense against float computations ---------------------------------------------------

def random_layer(rng, out_channels, weight_shape):
    w = rng.integers(-127, 128, weight_shape).astype(np.int8)
    w_scale = rng.uniform(0.002, 0.02, out_channels)
    bias = rng.integers(-3000, 3000, out_channels).astype(np.int32)
    return w, w_scale, bias


def requant_constants(in_scale, w_scale, out_scale):
    pairs = [exact_multiplier(in_scale * s / out_scale) for s in w_scale]
    return (np.array([m for m, _ in pairs], np.int32), np.array([s for _, s in pairs], np.int32))


def check_within_one_lsb(got, want, lo, hi):
    assert got.dtype == np.int8
    diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert diff.max() <= 1
    assert (diff == 0).mean() > 0.9
    inside = (want > lo) & (want < hi)
    assert inside.mean() > 0.3                       # the comparison is not all saturation


CONV_CASES = [
    dict(strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), kernel=(3, 3)),
    dict(strides=(2, 2), pads=(1, 0, 0, 1), dilations=(1, 1), kernel=(3, 3)),
    dict(strides=(1, 2), pads=(2, 1, 2, 1), dilations=(2, 1), kernel=(3, 2)),
    dict(strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), kernel=(1, 1)),
]


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("relu", [False, True])
def test_qconv_matches_float_conv_within_one_lsb(case, relu):
    rng = np.random.default_rng(len(CONV_CASES) * relu + CONV_CASES.index(case))
    n, c, h, wd, m = 2, 5, 9, 8, 6
    kh, kw = case["kernel"]
    in_scale, in_zp = 0.031, int(rng.integers(-20, 20))
    x = rng.integers(-128, 128, (n, c, h, wd)).astype(np.int8)
    w, w_scale, bias = random_layer(rng, m, (m, c, kh, kw))

    x_f = ((x.astype(np.int32) - in_zp) * in_scale).astype(np.float32)
    w_f = (w * w_scale[:, None, None, None]).astype(np.float32)
    b_f = (bias * in_scale * w_scale).astype(np.float32)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[kh, kw],
                            strides=list(case["strides"]), pads=list(case["pads"]),
                            dilations=list(case["dilations"]))
    y_f = run_ort([conv], {"x": (TensorProto.FLOAT, list(x.shape))},
                  {"y": (TensorProto.FLOAT, None)}, {"w": w_f, "b": b_f}, {"x": x_f})

    out_scale = float(np.abs(y_f).max()) / 160          # a little saturation at the top
    out_zp = int(rng.integers(-30, 30))
    lo, hi = (out_zp if relu else -128), 127
    mult, shift = requant_constants(in_scale, w_scale, out_scale)
    got = qconv(x, w, bias, mult, shift, in_zp=in_zp, out_zp=out_zp, lo=lo, hi=hi,
                strides=case["strides"], pads=case["pads"], dilations=case["dilations"])
    assert got.shape == y_f.shape
    check_within_one_lsb(got, float_requantize(y_f, out_scale, out_zp, lo, hi), lo, hi)


@pytest.mark.parametrize("relu", [False, True])
def test_qdense_matches_float_gemm_within_one_lsb(relu):
    rng = np.random.default_rng(40 + relu)
    n, k, m = 16, 50, 12
    in_scale, in_zp = 0.02, int(rng.integers(-128, 128))
    x = rng.integers(-128, 128, (n, k)).astype(np.int8)
    w, w_scale, bias = random_layer(rng, m, (k, m))

    x_f = ((x.astype(np.int32) - in_zp) * in_scale).astype(np.float32)
    w_f = (w * w_scale[None, :]).astype(np.float32)
    b_f = (bias * in_scale * w_scale).astype(np.float32)
    y_f = run_ort([helper.make_node("Gemm", ["x", "w", "b"], ["y"])],
                  {"x": (TensorProto.FLOAT, [n, k])}, {"y": (TensorProto.FLOAT, [n, m])},
                  {"w": w_f, "b": b_f}, {"x": x_f})

    out_scale = float(np.abs(y_f).max()) / 160
    out_zp = int(rng.integers(-30, 30))
    lo, hi = (out_zp if relu else -128), 127
    mult, shift = requant_constants(in_scale, w_scale, out_scale)
    got = qdense(x, w, bias, mult, shift, in_zp=in_zp, out_zp=out_zp, lo=lo, hi=hi)
    assert got.shape == (n, m)
    check_within_one_lsb(got, float_requantize(y_f, out_scale, out_zp, lo, hi), lo, hi)


@pytest.mark.parametrize("pads, strides, dilations", [
    ((1, 1, 1, 1), (1, 1), (1, 1)),
    ((2, 0, 1, 3), (2, 1), (1, 2)),
    ((0, 2, 2, 0), (1, 2), (2, 1)),
])
def test_qconv_padding_reads_as_input_zero_point(pads, strides, dilations):
    rng = np.random.default_rng(sum(pads))
    x = rng.integers(-128, 128, (2, 3, 7, 6)).astype(np.int8)
    w = rng.integers(-127, 128, (4, 3, 3, 2)).astype(np.int8)
    bias = rng.integers(-5000, 5000, 4).astype(np.int32)
    mult = rng.integers(1 << 30, 1 << 31, 4).astype(np.int32)
    shift = np.full(4, 38, np.int32)
    in_zp = 37
    kwargs = dict(in_zp=in_zp, out_zp=-3, lo=-128, hi=127, strides=strides,
                  dilations=dilations)
    top, left, bottom, right = pads
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=in_zp)
    got = qconv(x, w, bias, mult, shift, pads=pads, **kwargs)
    want = qconv(padded, w, bias, mult, shift, pads=(0, 0, 0, 0), **kwargs)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 20


# overflow --------------------------------------------------------------------------------------

def edge_dense():
    """A [1, K] input whose accumulator is exactly INT32_MAX: 66311 * 255 * 127 + 239 * 8."""
    in_zp = -128
    x = np.full((1, 66312), 127, dtype=np.int8)
    x[0, -1] = 111                                        # 111 - (-128) = 239
    w = np.full((66312, 1), 127, dtype=np.int8)
    w[-1, 0] = 8
    assert 66311 * 255 * 127 + 239 * 8 == INT32_MAX
    return x, w, in_zp


def dense(x, w, in_zp, zp=0):
    one = np.ones(w.shape[1], dtype=np.int32)
    return qdense(x, w, 0 * one, one << 30, one * 63, in_zp=in_zp, out_zp=zp, lo=-128, hi=127)


def test_qdense_accumulator_at_int32_max_does_not_raise():
    x, w, in_zp = edge_dense()
    # INT32_MAX * 2**30 / 2**63 = 0.125 - tiny: rounds to 0
    np.testing.assert_array_equal(dense(x, w, in_zp, zp=5), [[5]])


def test_qdense_accumulator_overflow_raises():
    x, w, in_zp = edge_dense()
    x = np.concatenate([x, np.full((1, 1), -127, np.int8)], axis=1)     # one more: +1
    w = np.concatenate([w, np.ones((1, 1), np.int8)])
    with pytest.raises(OverflowError,
                       match=r"^int32 accumulator overflow: the compiler's bound check failed$"):
        dense(x, w, in_zp)


def test_qdense_accumulator_below_int32_min_raises():
    x, w, in_zp = edge_dense()
    x = np.concatenate([x, np.full((1, 1), -127, np.int8)], axis=1)
    w = -np.concatenate([w, np.ones((1, 1), np.int8)])                 # exactly INT32_MIN
    np.testing.assert_array_equal(dense(x, w, in_zp, zp=5), [[5]])
    x = np.concatenate([x, np.full((1, 1), -127, np.int8)], axis=1)     # one less
    w = np.concatenate([w, -np.ones((1, 1), np.int8)])
    with pytest.raises(OverflowError,
                       match=r"^int32 accumulator overflow: the compiler's bound check failed$"):
        dense(x, w, in_zp)


def test_qconv_accumulator_overflow_raises():
    x = np.full((1, 64, 33, 33), 127, dtype=np.int8)
    w = np.full((1, 64, 33, 33), 127, dtype=np.int8)   # 64*33*33 * 255*127 > 2**31
    one = np.ones(1, dtype=np.int32)
    with pytest.raises(OverflowError,
                       match=r"^int32 accumulator overflow: the compiler's bound check failed$"):
        qconv(x, w, 0 * one, one << 30, one * 63, in_zp=-128, out_zp=0, lo=-128, hi=127)
