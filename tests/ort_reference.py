"""The references a quantized model is compared with, independent of the CPU.

onnxruntime's optimized int8 kernels give different answers on different CPUs: without VNNI,
its u8s8/s8s8 kernels saturate 16-bit intermediate sums (measured: up to 41 LSB on a QDQ
Conv, 110 LSB on MatMulInteger, on an AVX2-only AMD EPYC), with VNNI they do not. So the
tests never assert against a default session. The references are:

* a model of QuantizeLinear/DequantizeLinear pairs around float operators (QDQ):
  onnxruntime with graph optimizations disabled (:func:`reference_session`), which runs
  DequantizeLinear -> float op -> QuantizeLinear as written;
* a model with integer operators (QLinearConv, QLinearMatMul, MatMulInteger, ConvInteger and
  the com.microsoft QGemm, QLinearAdd, QLinearGlobalAveragePool, QLinearLeakyRelu,
  QLinearSigmoid): :func:`qoperator_reference`, onnx's ``ReferenceEvaluator`` with exact NumPy
  versions of those operators (integer accumulation, float32 requantization scale, round half
  to even, saturation), since onnxruntime always runs them on its optimized kernels; and of
  QuantizeLinear, DequantizeLinear (onnx 1.23's evaluator has none for opset 13) and
  inference-mode BatchNormalization (its own treats opset <= 13 as training mode).

:func:`reference_outputs` picks the right one; :func:`optimized_outputs` runs onnxruntime's
default session, whose difference the tests report but never assert.
"""

import numpy as np
import onnx
import onnxruntime as ort
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

__all__ = ["INTEGER_OPS", "OptimizedInt8Session", "guard_optimized_int8_sessions",
           "optimized_outputs", "qoperator_reference", "reference_outputs", "reference_session"]

#: Operators onnxruntime runs only on its optimized (CPU-dependent) integer kernels.
INTEGER_OPS = {"QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger", "QGemm",
               "QLinearAdd", "QLinearGlobalAveragePool", "QLinearAveragePool",
               "QLinearLeakyRelu", "QLinearSigmoid", "QLinearConcat", "QLinearMul"}


_QUANTIZED_OPS = INTEGER_OPS | {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
_SESSION = ort.InferenceSession          # the real class, whatever a guard puts in its place


def _session(model, level) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = level
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return _SESSION(source, options, providers=["CPUExecutionProvider"])


class OptimizedInt8Session(AssertionError):
    """A test opened onnxruntime's default (optimized) session on a quantized model outside
    :func:`optimized_outputs`: its int8 answer depends on the CPU, so nothing may assert on
    it."""


def guard_optimized_int8_sessions(monkeypatch) -> None:
    """Make ``onnxruntime.InferenceSession`` refuse a quantized model (QDQ or integer
    operators) unless graph optimizations are disabled: the suite's structural guarantee
    that no test's outcome depends on the CPU's SIMD instructions. Float models and
    :func:`optimized_outputs` (reporting only) are unaffected."""
    def guarded(source, sess_options=None, *args, **kwargs):
        level = (sess_options.graph_optimization_level if sess_options is not None
                 else ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        if level != ort.GraphOptimizationLevel.ORT_DISABLE_ALL:
            model = onnx.load_from_string(source) if isinstance(source, bytes) else \
                onnx.load(str(source), load_external_data=False)
            quantized = sorted({n.op_type for n in model.graph.node} & _QUANTIZED_OPS)
            if quantized:
                raise OptimizedInt8Session(
                    f"onnxruntime's optimized session on a quantized model ({', '.join(quantized)}"
                    f"): its int8 kernels differ between CPUs; use ort_reference."
                    f"reference_outputs (or optimized_outputs to report the difference)")
        return _SESSION(source, sess_options, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", guarded)


def reference_session(model) -> ort.InferenceSession:
    """onnxruntime's reference path: no graph optimization, so no QDQ group is fused into an
    integer kernel."""
    return _session(model, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)


def _per_sample(run, feeds: "dict[str, np.ndarray]") -> "list[np.ndarray]":
    count = len(next(iter(feeds.values())))
    runs = [run({k: v[i:i + 1] for k, v in feeds.items()}) for i in range(count)]
    return [np.concatenate([r[j] for r in runs]) for j in range(len(runs[0]))]


def optimized_outputs(model, feeds: "dict[str, np.ndarray]") -> "list[np.ndarray]":
    """onnxruntime's default session (optimized kernels: CPU-dependent), one sample at a time;
    for reporting only."""
    session = _session(model, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    return _per_sample(lambda f: session.run(None, f), feeds)


def _model(model) -> onnx.ModelProto:
    return model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))


def reference_outputs(model, feeds: "dict[str, np.ndarray]") -> "list[np.ndarray]":
    """The CPU-independent reference outputs of ``model`` on ``feeds`` (first axis: samples,
    run one at a time): :func:`qoperator_reference` for a model with integer operators, else
    onnxruntime's reference path."""
    model = _model(model)
    if any(n.op_type in INTEGER_OPS for n in model.graph.node):
        evaluator = ReferenceEvaluator(model, new_ops=_EXACT_OPS)
        return _per_sample(lambda f: evaluator.run(None, f), feeds)
    session = reference_session(model)
    return _per_sample(lambda f: session.run(None, f), feeds)


def qoperator_reference(model, feeds: "dict[str, np.ndarray]") -> "list[np.ndarray]":
    """Evaluate ``model`` with onnx's reference evaluator and the exact integer operators."""
    evaluator = ReferenceEvaluator(_model(model), new_ops=_EXACT_OPS)
    return _per_sample(lambda f: evaluator.run(None, f), feeds)


# the exact operators ---------------------------------------------------------------------------

def _f32(value) -> np.ndarray:
    return np.asarray(value, dtype=np.float32)


def _requantize(acc: np.ndarray, scale: np.ndarray, y_zp: np.ndarray) -> np.ndarray:
    """``saturate(round_half_even(float32(float32(acc) * scale)) + y_zp)``: the int32
    accumulator converted to float32, multiplied by the float32 scale in float32 (one
    rounding), rounded half to even."""
    info = np.iinfo(y_zp.dtype)
    product = acc.astype(np.float32) * _f32(scale)
    return np.clip(np.rint(product) + y_zp.astype(np.float32), info.min, info.max
                   ).astype(y_zp.dtype)


def _quantize(real: np.ndarray, y_scale, y_zp: np.ndarray) -> np.ndarray:
    """QuantizeLinear: ``saturate(round_half_even(float32(x) / float32(s)) + zp)``."""
    y_zp = np.asarray(y_zp)
    info = np.iinfo(y_zp.dtype)
    return np.clip(np.rint(_f32(real) / _f32(y_scale)) + y_zp.astype(np.float32), info.min,
                   info.max).astype(y_zp.dtype)


def _dequantize(q, scale, zp) -> np.ndarray:
    """DequantizeLinear: ``float32((q - zp) * s)``."""
    return ((q.astype(np.int32) - np.asarray(zp).astype(np.int32)).astype(np.float32)
            * _f32(scale))


def _centered(q, zp, axis_len=None) -> np.ndarray:
    zp = np.asarray(zp, np.int64)
    if zp.ndim == 1 and axis_len is not None:                 # per output channel (axis 0)
        zp = zp.reshape((-1,) + (1,) * (axis_len - 1))
    return q.astype(np.int64) - zp


def _conv_int(x: np.ndarray, w: np.ndarray, group: int, strides, pads, dilations
              ) -> np.ndarray:
    """Integer convolution of zero-point-free ``x`` [N, C, H, W] and ``w`` [M, C/g, kh, kw]:
    padding reads 0 (the zero point), accumulation in int64."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    top, left, bottom, right = pads
    xp = np.zeros((n, c, h + top + bottom, wd + left + right), np.int64)
    xp[:, :, top:top + h, left:left + wd] = x
    oh = (xp.shape[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (xp.shape[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    y = np.zeros((n, m, oh, ow), np.int64)
    mg = m // group
    for g in range(group):
        xg, wg = xp[:, g * cg:(g + 1) * cg], w[g * mg:(g + 1) * mg]
        for i in range(kh):
            for j in range(kw):
                patch = xg[:, :, i * dilations[0]:i * dilations[0] + strides[0] * (oh - 1) + 1:
                           strides[0], j * dilations[1]:j * dilations[1] +
                           strides[1] * (ow - 1) + 1:strides[1]]
                y[:, g * mg:(g + 1) * mg] += np.einsum("nchw,mc->nmhw", patch, wg[:, :, i, j])
    return y


def _conv_attrs(op: OpRun, w: np.ndarray) -> tuple:
    if getattr(op, "auto_pad", "NOTSET") not in (None, "NOTSET", b"NOTSET"):
        raise NotImplementedError("the exact reference implements explicit pads only")
    spatial = w.ndim - 2
    if spatial == 1:            # a 1-D convolution is the 2-D one over an image of height 1
        (s,), (d,), (a, b) = op.strides or (1,), op.dilations or (1,), op.pads or (0, 0)
        return op.group or 1, (1, s), (0, a, 0, b), (1, d)
    if spatial != 2:
        raise NotImplementedError("the exact reference implements 1-D and 2-D convolutions "
                                  "only")
    return (op.group or 1, op.strides or (1, 1), op.pads or (0, 0, 0, 0),
            op.dilations or (1, 1))


def _conv_nd(x: np.ndarray, w: np.ndarray, attrs: tuple) -> np.ndarray:
    """:func:`_conv_int` of a 2-D convolution, or of a 1-D one ``x`` [N, C, L], ``w``
    [M, C/g, k] as height 1."""
    if w.ndim == 3:
        return _conv_int(x[:, :, None], w[:, :, None], *attrs)[:, :, 0]
    return _conv_int(x, w, *attrs)


def _axis_shape(op: OpRun, param, ndim: int):
    """A per-axis parameter reshaped to broadcast along ``axis`` (default 1)."""
    param = np.asarray(param)
    if param.ndim == 0:
        return param
    axis = (getattr(op, "axis", 1) if getattr(op, "axis", None) is not None else 1) % ndim
    return param.reshape([-1 if d == axis else 1 for d in range(ndim)])


class QuantizeLinear(OpRun):
    op_domain = ""

    def _run(self, x, y_scale, y_zp=None, **_):
        y_zp = np.asarray(0, np.uint8) if y_zp is None else y_zp
        return (_quantize(x, _axis_shape(self, y_scale, x.ndim), _axis_shape(self, y_zp, x.ndim)
                          ).astype(y_zp.dtype),)


class DequantizeLinear(OpRun):
    op_domain = ""

    def _run(self, x, x_scale, x_zp=None, **_):
        x_zp = np.zeros((), x.dtype) if x_zp is None else x_zp
        return (_dequantize(x, _axis_shape(self, x_scale, x.ndim),
                            _axis_shape(self, x_zp, x.ndim)),)


class QLinearConv(OpRun):
    op_domain = ""

    def _run(self, x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B=None, **_):
        acc = _conv_nd(_centered(x, x_zp), _centered(w, w_zp, w.ndim), _conv_attrs(self, w))
        channel = (1, -1) + (1,) * (acc.ndim - 2)
        if B is not None:
            acc = acc + B.astype(np.int64).reshape(channel)
        scale = _f32(_f32(x_scale) * _f32(w_scale)) / _f32(y_scale)
        return (_requantize(acc, np.reshape(scale, channel), y_zp),)


class ConvInteger(OpRun):
    op_domain = ""

    def _run(self, x, w, x_zp=None, w_zp=None, **_):
        acc = _conv_nd(_centered(x, 0 if x_zp is None else x_zp),
                       _centered(w, 0 if w_zp is None else w_zp, w.ndim), _conv_attrs(self, w))
        return (acc.astype(np.int32),)


def _matmul_scale(a_scale, b_scale, y_scale, alpha=1.0) -> np.ndarray:
    return _f32(_f32(_f32(alpha) * _f32(a_scale)) * _f32(b_scale)) / _f32(y_scale)


class QLinearMatMul(OpRun):
    op_domain = ""

    def _run(self, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp, **_):
        acc = _centered(a, a_zp) @ (b.astype(np.int64) - np.asarray(b_zp, np.int64))
        return (_requantize(acc, _matmul_scale(a_scale, b_scale, y_scale), y_zp),)


class QGemm(OpRun):
    """com.microsoft QGemm: ``alpha * (A - a_zp) @ (B - b_zp) + C`` requantized with
    ``alpha * a_scale * b_scale / y_scale`` (C is int32 in accumulator units)."""
    op_domain = "com.microsoft"

    def _run(self, a, a_scale, a_zp, b, b_scale, b_zp, c=None, y_scale=None, y_zp=None, **_):
        alpha = float(getattr(self, "alpha", 1.0) or 1.0)
        if alpha != 1.0 or getattr(self, "transA", 0):
            raise NotImplementedError("the exact reference implements alpha=1, transA=0")
        b = b.astype(np.int64) - np.asarray(b_zp, np.int64).reshape(
            (-1, 1) if getattr(self, "transB", 0) else (1, -1))
        acc = _centered(a, a_zp) @ (b.T if getattr(self, "transB", 0) else b)
        if c is not None:
            acc = acc + c.astype(np.int64)
        return (_requantize(acc, _matmul_scale(a_scale, b_scale, y_scale), y_zp),)


class QLinearAdd(OpRun):
    """com.microsoft QLinearAdd, as its documentation defines it: ``C = (A_scale * (A -
    A_zp) + B_scale * (B - B_zp)) / C_scale + C_zp``, in float32 (DequantizeLinear, Add,
    QuantizeLinear)."""
    op_domain = "com.microsoft"

    def _run(self, a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp, **_):
        real = _dequantize(a, a_scale, a_zp) + _dequantize(b, b_scale, b_zp)
        return (_quantize(real, c_scale, c_zp),)


class QLinearGlobalAveragePool(OpRun):
    """com.microsoft QLinearGlobalAveragePool (channels first): the exact integer sum of
    ``x - x_zp`` over the image, requantized with the float32 scale ``x_scale / (y_scale *
    N)``."""
    op_domain = "com.microsoft"

    def _run(self, x, x_scale, x_zp, y_scale, y_zp, **_):
        if getattr(self, "channels_last", 0):
            raise NotImplementedError("the exact reference implements channels first only")
        axes = tuple(range(2, x.ndim))                    # 1-D or 2-D
        acc = _centered(x, x_zp).sum(axis=axes, keepdims=True)
        count = int(np.prod(x.shape[2:]))
        return (_requantize(acc, _f32(x_scale) / (_f32(y_scale) * _f32(count)), y_zp),)


def _table_op(function):
    def _run(self, x, x_scale, x_zp, y_scale, y_zp=None, **_):
        y_zp = np.asarray(0 if y_zp is None else y_zp, x.dtype)
        real = _dequantize(x, x_scale, x_zp)
        return (_quantize(function(self, real), y_scale, y_zp),)
    return _run


class QLinearLeakyRelu(OpRun):
    """com.microsoft QLinearLeakyRelu: DequantizeLinear, LeakyRelu in float32,
    QuantizeLinear."""
    op_domain = "com.microsoft"
    _run = _table_op(lambda self, v: np.where(v >= 0, v, v * _f32(self.alpha)))


class QLinearSigmoid(OpRun):
    """com.microsoft QLinearSigmoid: DequantizeLinear, Sigmoid in float32, QuantizeLinear."""
    op_domain = "com.microsoft"
    _run = _table_op(lambda self, v: (_f32(1) / (_f32(1) + np.exp(-v))).astype(np.float32))


class BatchNormalization(OpRun):
    """Inference-mode BatchNormalization in float32 (onnx's own reference treats opset <= 13
    as training mode)."""
    op_domain = ""

    def _run(self, x, scale, bias, mean, var, **_):
        shape = (1, -1) + (1,) * (x.ndim - 2)
        epsilon = _f32(getattr(self, "epsilon", 1e-5) or 1e-5)
        scale, bias, mean, var = (_f32(p).reshape(shape) for p in (scale, bias, mean, var))
        return (((_f32(x) - mean) / np.sqrt(var + epsilon) * scale + bias).astype(np.float32),)


_EXACT_OPS = [BatchNormalization, QuantizeLinear, DequantizeLinear, QLinearConv, ConvInteger,
              QLinearMatMul, QGemm, QLinearAdd, QLinearGlobalAveragePool, QLinearLeakyRelu,
              QLinearSigmoid]
