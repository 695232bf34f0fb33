"""onnxruntime's int8 arithmetic on hwonnx's integer graph, for comparison only.

The accelerator computes :func:`hwonnx.golden.requantize` (a 31-bit fixed-point multiply,
ties rounded half up). onnxruntime's CPU kernels (QLinearConv, QLinearMatMul, QGemm, and the
QDQ groups it fuses into them) instead convert ``acc + bias`` to float32, multiply by the
float32 scale ``(s_in * s_w) / s_out`` and round the float32 product half to even;
QLinearAdd adds ``float32(s_a / s_out) * (a - z_a) + float32(s_b / s_out) * (b - z_b)`` in
float32 (hwonnx's residual sum, ``QEltwise`` of kind ``add`` or ``QAdd``).
:func:`evaluate_onnxruntime` evaluates an integer graph that way. It is a golden-only model
(no hardware computes it): it explains, value by value, every difference between
:func:`hwonnx.golden.evaluate` and onnxruntime on a pre-quantized model. See
``docs/arithmetic.md``, "Pre-quantized models".
"""

import numpy as np

from ..golden import GOLDEN_OPS, im2col
from ..golden.ops import INT32_MIN, lookup
from ..ir import Graph

__all__ = ["requantize_float32", "evaluate_onnxruntime"]


def requantize_float32(acc: np.ndarray, bias: np.ndarray, scale: np.ndarray,
                       zero_point: int, lo: int, hi: int) -> np.ndarray:
    """onnxruntime's requantization (MLAS ``MlasRequantizeOutput``): ``v = wrap32(acc +
    bias)``, ``y = clamp(round_half_even(float32(float32(v) * scale)) + zero_point, lo,
    hi)``, with a float32 ``scale`` per channel (last axis)."""
    v = acc.astype(np.int64) + bias.astype(np.int64)
    v = ((v - INT32_MIN) % (1 << 32)) + INT32_MIN
    product = v.astype(np.float32) * np.asarray(scale, np.float32)   # float32, rounded once
    return np.clip(np.rint(product) + zero_point, lo, hi).astype(np.int8)


def _scale(mult: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """The float32 multiplier that ``mult * 2**-shift`` holds (exact for a pre-quantized
    model, whose multiplier the quantizer takes from float32)."""
    return (mult.astype(np.float64) * np.exp2(-shift.astype(np.float64))).astype(np.float32)


def _qconv(x, w, bias, mult, shift, *, in_zp, out_zp, lo, hi, strides=(1, 1),
           pads=(0, 0, 0, 0), dilations=(1, 1), group=1, pad_q=None, **_):
    n, m = x.shape[0], w.shape[0]
    cg, mg = w.shape[1], m // group
    accs = []
    for g in range(group):
        patches = im2col(x[:, g * cg:(g + 1) * cg], w.shape[2:], strides, pads, dilations,
                         pad_value=np.int8(in_zp if pad_q is None else pad_q)
                         ).astype(np.int64) - in_zp
        accs.append(patches @ w[g * mg:(g + 1) * mg].reshape(mg, -1).astype(np.int64).T)
    y = requantize_float32(np.concatenate(accs, axis=-1), bias, _scale(mult, shift), out_zp,
                           lo, hi)
    (kh, kw), (h, wd) = w.shape[2:], x.shape[2:]
    oh = (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    return y.transpose(0, 2, 1).reshape(n, m, oh, ow)


def _qdense(x, w, bias, mult, shift, *, in_zp, out_zp, lo, hi, **_):
    acc = (x.astype(np.int64) - in_zp) @ w.astype(np.int64)
    return requantize_float32(acc, bias, _scale(mult, shift), out_zp, lo, hi)


def _qadd(a, b, mult, shift, *, za, zb, out_zp, lo, hi, a_scale, b_scale, out_scale, **_):
    ra = np.float32(a_scale) / np.float32(out_scale)
    rb = np.float32(b_scale) / np.float32(out_scale)
    y = ra * (a.astype(np.int64) - za).astype(np.float32) + \
        rb * (b.astype(np.int64) - zb).astype(np.float32)
    return np.clip(np.rint(y) + out_zp, lo, hi).astype(np.int8)


def _qavgpool(x, mult, shift, *, in_zp, out_zp, lo, hi, kernel, strides=(1, 1),
              pads=(0, 0, 0, 0), **attrs):
    if np.ndim(mult) == 2:     # a divisor per window (count_include_pad=0): golden's rounding
        return GOLDEN_OPS["QAvgPool"](x, mult, shift, in_zp=in_zp, out_zp=out_zp, lo=lo, hi=hi,
                                      kernel=kernel, strides=strides, pads=pads, **attrs)
    c = x.shape[1]
    ones = np.ones((c, 1) + tuple(kernel), dtype=np.int8)
    return _qconv(x, ones, np.zeros(c, np.int32), mult, shift, in_zp=in_zp, out_zp=out_zp,
                  lo=lo, hi=hi, strides=strides, pads=pads, group=c,
                  pad_q=attrs.get("pad_q"))


def _qeltwise(a, b, mult, shift, **attrs):
    """A sum of two equal shapes as QLinearAdd (:func:`_qadd`); the other kinds as golden."""
    if attrs["kind"] == "add" and a.shape == b.shape:
        return _qadd(a, b, mult, shift, **attrs)
    return GOLDEN_OPS["QEltwise"](a, b, mult, shift, **attrs)


_OPS = {**GOLDEN_OPS, "QConv": _qconv, "QDense": _qdense, "QAdd": _qadd,
        "QEltwise": _qeltwise, "QAvgPool": _qavgpool}


def evaluate_onnxruntime(graph: Graph, feeds: "dict[str, np.ndarray]"
                         ) -> "dict[str, np.ndarray]":
    """Evaluate the integer ``graph`` on ``feeds`` like :func:`hwonnx.golden.evaluate` with
    ``keep_all=True``, but requantizing as onnxruntime's CPU kernels do (see the module).
    ``QAdd`` and ``QEltwise`` need the ``a_scale``/``b_scale`` attributes the quantizer
    records."""
    env = {**graph.constants, **feeds}
    for node in graph.nodes:
        if all(v in feeds for v in node.outputs):
            continue
        env[node.outputs[0]] = _OPS[node.op](*(env[v] for v in node.inputs),
                                             **dict(node.attrs))
        if node.attrs.get("table") is not None:
            env[node.outputs[0]] = lookup(env[node.outputs[0]], node.attrs["table"])
    return env
