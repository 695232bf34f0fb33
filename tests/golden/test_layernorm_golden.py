"""The integer LayerNormalization (hwonnx/golden/layernorm.py, issue 38): its integer pieces
exactly (the integer square root over every input below 2^20 and drawn up to 2^62, the row
statistics against their definitions in Python integers), and the whole against onnxruntime's
float LayerNormalization (reference path: graph optimizations disabled) on the dequantized
int8 input, within the bound :func:`error_bound` derives from the parameters (not from the
outputs): at most that many output steps, on rows drawn at random, constant rows (variance
0), rows with one outlier and rows spanning the whole int8 range."""

import math
import re

import numpy as np
import onnxruntime
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from hwonnx.errors import QuantizationError
from hwonnx.golden.layernorm import ISQRT_MAX, error_bound, isqrt, qlayernorm, row_statistics
from hwonnx.quant.layernorm import layernorm_params
from hwonnx.quant.params import activation_params


def test_isqrt_is_the_floor_of_the_root_for_every_integer_below_2_20():
    n = np.arange(1 << 20, dtype=np.int64)
    r = isqrt(n)
    assert ((r * r <= n) & ((r + 1) * (r + 1) > n)).all()


@settings(max_examples=2000, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, ISQRT_MAX), min_size=1, max_size=8))
def test_isqrt_equals_python_isqrt_up_to_2_62(values):
    assert isqrt(np.array(values, np.int64)).tolist() == [math.isqrt(v) for v in values]


def test_isqrt_at_the_edges_of_its_domain():
    edges = [ISQRT_MAX, (1 << 62) - (1 << 31), (1 << 60) - 1, 1 << 60, 4, 3, 1, 0]
    assert isqrt(np.array(edges, np.int64)).tolist() == [math.isqrt(v) for v in edges]
    for bad in (-1, ISQRT_MAX + 1):
        with pytest.raises(ValueError, match=re.escape("isqrt takes integers in [0, 2^62)")):
            isqrt(np.array([bad], np.int64))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.integers(-128, 127), min_size=1, max_size=200))
def test_row_statistics_are_n_times_the_deviation_and_n2_times_the_variance(row):
    d, v = row_statistics(np.array([row], np.int8))
    n, s = len(row), sum(row)
    assert d[0].tolist() == [n * q - s for q in row]
    pairs = sum((row[i] - row[j]) ** 2 for i in range(n) for j in range(i))
    assert int(v[0, 0]) == pairs                       # V = sum_{i<j} (q_i - q_j)^2
    assert pairs == 0 or pairs >= n - 1


def ort_layernorm(x, gamma, beta, epsilon):
    """onnxruntime's float LayerNormalization (opset 17, axis -1), optimizations disabled."""
    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1,
                          epsilon=epsilon)], "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
        [numpy_helper.from_array(gamma.astype(np.float32), "gamma"),
         numpy_helper.from_array(beta.astype(np.float32), "beta")])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x.astype(np.float32)})[0].astype(np.float64)


def rows(kind, n, rng):
    """int8 rows of one kind, 64 of them."""
    if kind == "random":
        return rng.integers(-128, 128, (64, n))
    if kind == "narrow":                               # small variance: few distinct values
        return rng.integers(-2, 3, (64, n)) + rng.integers(-100, 100, (64, 1))
    if kind == "constant":
        return np.repeat(rng.integers(-128, 128, (64, 1)), n, axis=1)
    if kind == "outlier":                               # V = N - 1 and larger
        q = np.repeat(rng.integers(-127, 127, (64, 1)), n, axis=1)
        q[np.arange(64), rng.integers(0, n, 64)] += rng.choice([-1, 1], 64)
        return q
    return np.where(rng.random((64, n)) < 0.5, -128, 127)                # "extreme"


CASES = [(n, kind, epsilon) for n in (8, 64, 192) for kind in
         ("random", "narrow", "constant", "outlier", "extreme") for epsilon in (1e-5, 1e-6)] + \
    [(192, "random", 1e-12), (768, "random", 1e-5), (4096, "extreme", 1e-5),
     (4096, "outlier", 1e-6)]


@pytest.mark.parametrize("n, kind, epsilon", CASES)
def test_golden_layernorm_is_within_its_bound_of_onnxruntime(n, kind, epsilon):
    rng = np.random.default_rng([n, len(kind), int(-math.log10(epsilon))])
    in_scale, in_zp = 0.05 * rng.uniform(0.5, 2), int(rng.integers(-10, 10))
    gamma = rng.normal(1.0, 0.3, n) * rng.choice([-1, 1], n)
    beta = rng.normal(0.0, 0.2, n)
    q = rows(kind, n, rng)
    x = in_scale * (q - in_zp)
    reference = ort_layernorm(x, gamma, beta, epsilon)
    # the output scale as calibration makes it: the float range on these rows and on as many
    # random ones (constant rows alone would calibrate to the bias's range)
    calibration = ort_layernorm(in_scale * (rows("random", n, rng) - in_zp), gamma, beta,
                                epsilon)
    out_scale, out_zp = activation_params(min(reference.min(), calibration.min()),
                                          max(reference.max(), calibration.max()))
    params = layernorm_params("ln", n, in_scale, gamma, beta, epsilon, out_scale, out_zp)
    y = qlayernorm(q.astype(np.int8), params)
    u = np.clip(reference / out_scale, -128 - out_zp, 127 - out_zp)
    error = np.abs(y.astype(np.float64) - out_zp - u)
    bound = error_bound(params, gamma, beta, out_scale)
    # onnxruntime's own float32 rounding, a few ulps of the values (not in error_bound)
    bound += 1e-5 * (np.abs(u).max() + 1)
    assert error.max() <= bound, (error.max(), bound)
    # the bound itself: half a step of rounding, plus the gamma multipliers' rounding times
    # the largest normalized value (sqrt(N)), plus the rest (these cases: 0.504 to 0.648)
    assert bound < 0.55 + math.sqrt(n) / 400, bound


def test_layernorm_of_a_constant_row_is_the_bias():
    params = layernorm_params("ln", 4, 0.1, np.ones(4), np.array([0.5, -0.5, 0.25, 0.0]),
                              1e-5, 0.01, 3)
    y = qlayernorm(np.full((2, 4), 17, np.int8), params)
    assert y.tolist() == [[53, -47, 28, 3]] * 2        # zero point + beta / 0.01
    one = layernorm_params("ln", 1, 0.1, np.ones(1), np.array([0.07]), 1e-5, 0.01, 0)
    assert qlayernorm(np.array([[-128], [5], [127]], np.int8), one).tolist() == [[7]] * 3


@pytest.mark.parametrize("kwargs, message", [
    (dict(n=0), "LayerNormalization 'ln' normalizes rows of 0 elements; the integer LayerNorm "
                "takes 1 to 65535"),
    (dict(in_scale=0.0), "LayerNormalization 'ln' has input scale 0.0; it must be positive "
                         "and finite"),
    (dict(out_scale=float("inf")), "LayerNormalization 'ln' has output scale inf; it must be "
                                   "positive and finite"),
    (dict(gamma=np.full(4, 1e9)), "LayerNormalization 'ln' has a gamma of up to 1e+11 output "
                                  "steps; the integer LayerNorm takes at most 6.71068e+07"),
    (dict(beta=np.full(4, 1e5)), "LayerNormalization 'ln' has a bias of 1e+07 output steps; "
                                 "the integer LayerNorm takes less than 2^20"),
    (dict(epsilon=1e17), "LayerNormalization 'ln' has epsilon 1e+17 at input scale 0.1: N^2 "
                         "eps / s^2 = 1.6e+20 is too large for the integer square root"),
])
def test_layernorm_parameters_out_of_reach_are_refused_by_name(kwargs, message):
    args = dict(name="ln", n=4, in_scale=0.1, gamma=np.ones(4), beta=np.zeros(4),
                epsilon=1e-5, out_scale=0.01, out_zp=0)
    with pytest.raises(QuantizationError, match="^" + re.escape(message) + "$"):
        layernorm_params(**{**args, **kwargs})
