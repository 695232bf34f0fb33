"""The references the quantized-model tests assert against (``ort_reference``): exact integer
operators checked by hand on ties and saturation, against onnxruntime's reference path on the
QDQ twin of every quantize_static model, and independent of the CPU by construction."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ort_reference
from ort_reference import (INTEGER_OPS, OptimizedInt8Session, guard_optimized_int8_sessions,
                           optimized_outputs, qoperator_reference, reference_outputs,
                           reference_session)
from prequantized_helpers import SAMPLES, dims, onnxruntime_outputs, quantized

U8, I8, F = TensorProto.UINT8, TensorProto.INT8, TensorProto.FLOAT


def _graph_model(nodes, inputs, output, inits, domains=()):
    graph = helper.make_graph(
        nodes, "ref", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(*output)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    opsets = [helper.make_opsetid("", 13)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, ir_version=8, opset_imports=opsets)


def test_qlinear_matmul_rounds_half_to_even_and_saturates():
    """(a - 2) @ b with a_scale * b_scale / y_scale = 0.5 exactly: 5 * 0.5 = 2.5 -> 2, 7 * 0.5
    = 3.5 -> 4, -3 * 0.5 = -1.5 -> -2, 25 * 0.5 = 12.5 -> 12, and 600 * 0.5 + 10 saturates
    at 127."""
    model = _graph_model(
        [helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"],
                          ["y"])],
        [("a", I8, [1, 1])], ("y", I8, [1, 4]),
        {"sa": np.float32(0.25), "za": np.int8(2), "b": np.array([[5, 7, -3, 120]], np.int8),
         "sb": np.float32(0.5), "zb": np.int8(0), "sy": np.float32(0.25), "zy": np.int8(10)})
    y = qoperator_reference(model, {"a": np.array([[3], [7]], np.int8)})[0]
    np.testing.assert_array_equal(y, [[12, 14, 8, 70], [22, 28, 2, 127]])


def test_qlinear_conv_accumulates_integers_with_padding_at_the_zero_point():
    """A 3x3 all-ones kernel over a 3x3 image of the zero point plus one pixel: every output
    that sees the pixel counts it once; padding reads the zero point (0 after subtracting)."""
    x = np.full((1, 1, 3, 3), 100, np.uint8)
    x[0, 0, 1, 1] = 104
    model = _graph_model(
        [helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "b"],
                          ["y"], pads=[1, 1, 1, 1])],
        [("x", U8, [1, 1, 3, 3])], ("y", U8, [1, 1, 3, 3]),
        {"sx": np.float32(1.0), "zx": np.uint8(100), "w": np.ones((1, 1, 3, 3), np.int8),
         "sw": np.float32(1.0), "zw": np.int8(0), "sy": np.float32(2.0), "zy": np.uint8(0),
         "b": np.array([1], np.int32)})
    y = qoperator_reference(model, {"x": x})[0]
    np.testing.assert_array_equal(y, np.full((1, 1, 3, 3), 2))   # (4 + 1) / 2 = 2.5 -> 2


def test_qlinear_add_is_dequantize_add_quantize():
    model = _graph_model(
        [helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["c"],
                          domain="com.microsoft")],
        [("a", I8, [1, 3]), ("b", I8, [1, 3])], ("c", I8, [1, 3]),
        {"sa": np.float32(0.5), "za": np.int8(0), "sb": np.float32(0.25), "zb": np.int8(4),
         "sc": np.float32(1.0), "zc": np.int8(-3)}, domains=["com.microsoft"])
    a, b = np.array([[1, 3, 100]], np.int8), np.array([[6, 6, 127]], np.int8)
    y = qoperator_reference(model, {"a": a, "b": b})[0]
    # 0.5 + 0.5 = 1 -> -2; 1.5 + 0.5 = 2 -> -1; 50 + 30.75 -> 81 - 3 = 78
    np.testing.assert_array_equal(y, [[-2, -1, 78]])


def test_batchnorm_is_inference_mode():
    """onnx's own evaluator treats BatchNormalization at opset <= 13 as training mode; the
    reference's equals onnxruntime's float BatchNormalization."""
    rng = np.random.default_rng(0)
    inits = {"s": rng.uniform(0.5, 2, 4), "b": rng.normal(0, 1, 4), "m": rng.normal(0, 1, 4),
             "v": rng.uniform(0.5, 2, 4)}
    model = _graph_model(
        [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"]),
         helper.make_node("QuantizeLinear", ["bn", "qs", "qz"], ["q"]),
         helper.make_node("QLinearMatMul", ["q", "qs", "qz", "w", "ws", "wz", "qs", "qz"],
                          ["y"])],
        [("x", F, [1, 4, 2, 2])], ("y", I8, [1, 4, 2, 2]),
        {**{k: v.astype(np.float32) for k, v in inits.items()}, "qs": np.float32(0.05),
         "qz": np.int8(0), "w": np.eye(2, dtype=np.int8), "ws": np.float32(1.0),
         "wz": np.int8(0)})
    x = rng.normal(0, 1, (3, 4, 2, 2)).astype(np.float32)
    got = reference_outputs(model, {"x": x})[0]
    float_bn = model.graph.node[0]
    bn_only = _graph_model([float_bn], [("x", F, [1, 4, 2, 2])], ("bn", F, [1, 4, 2, 2]),
                           {k: v.astype(np.float32) for k, v in inits.items()})
    want = reference_outputs(bn_only, {"x": x})[0]
    np.testing.assert_array_equal(got, np.clip(np.rint(want / np.float32(0.05)), -128, 127))


@pytest.mark.parametrize("act_type", ["QInt8", "QUInt8"])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("kind", ["conv_relu", "residual", "gemm", "cnn", "mlp_bias",
                                  "pool_act"])
def test_exact_reference_follows_the_qdq_reference_path(tmp_path, kind, per_channel,
                                                        act_type):
    """quantize_static writes a QOperator model and its QDQ twin with the same parameters:
    the exact reference of the first and onnxruntime's reference path on the second (float
    ops between DequantizeLinear and QuantizeLinear) agree within 1 LSB, with the same top-1.
    (Not cnn_bn: its QDQ form quantizes the BatchNormalization scale to int8, its QOperator
    form keeps it float, so the two are different models.)"""
    qop = quantized(tmp_path, kind, "QOperator", per_channel, act_type)
    qdq = quantized(tmp_path, kind, "QDQ", per_channel, act_type)
    x = np.random.default_rng(11).normal(0, 1, (SAMPLES, *dims(qdq)[1:])).astype(np.float32)
    y_qop, q_qop, _ = onnxruntime_outputs(qop, x)
    y_qdq, q_qdq, _ = onnxruntime_outputs(qdq, x)
    lsb = np.abs(q_qop - q_qdq)
    print(f"{kind} per_channel={per_channel} {act_type}: {np.count_nonzero(lsb)} of "
          f"{lsb.size} values differ, max {lsb.max()} LSB")
    assert lsb.max() <= 1
    np.testing.assert_array_equal(y_qop.argmax(axis=1), y_qdq.argmax(axis=1))


def test_references_never_run_optimized_integer_kernels(tmp_path, monkeypatch):
    """Independent of the CPU by construction: the reference path disables every graph
    optimization (no QDQ group becomes an integer kernel), and a model with integer operators
    is evaluated without onnxruntime at all."""
    qdq = quantized(tmp_path, "cnn", "QDQ", True, "QUInt8")
    qop = quantized(tmp_path, "cnn", "QOperator", True, "QUInt8")
    assert reference_session(qdq).get_session_options().graph_optimization_level == \
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert any(n.op_type in INTEGER_OPS for n in onnx.load(str(qop)).graph.node)
    x = np.random.default_rng(1).normal(0, 1, (4, 3, 8, 8)).astype(np.float32)
    optimized = optimized_outputs(qop, {"x": x})[0]

    def refuse(*args, **kwargs):
        raise AssertionError("the exact reference must not run onnxruntime")

    monkeypatch.setattr(ort_reference, "_SESSION", refuse)
    exact = reference_outputs(qop, {"x": x})[0]
    assert exact.shape == optimized.shape


def test_guard_refuses_optimized_sessions_on_quantized_models(tmp_path, monkeypatch):
    """The guard every test runs under (tests/conftest.py): a default session on a QDQ or
    QOperator model raises, the reference path, float models and optimized_outputs do not."""
    guard_optimized_int8_sessions(monkeypatch)
    qdq = quantized(tmp_path, "gemm", "QDQ", False, "QInt8")
    qop = quantized(tmp_path, "gemm", "QOperator", False, "QInt8")
    for model in (qdq, qop):
        with pytest.raises(OptimizedInt8Session, match=r"^onnxruntime's optimized session on "
                           r"a quantized model \((\w+, )*QuantizeLinear(, \w+)*\): its int8 "
                           r"kernels differ between CPUs"):
            ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    reference_session(qdq)
    ort.InferenceSession(str(tmp_path / "gemm.onnx"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).normal(0, 1, (2, 24)).astype(np.float32)
    assert optimized_outputs(qop, {"x": x})[0].shape == (2, 10)
