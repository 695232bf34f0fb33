"""The bit-exact specification of the integer arithmetic the accelerator executes.

Every function here is small, pure NumPy, and is what the RTL must equal bit for bit. The
formulas are written out in ``docs/arithmetic.md``.
"""

from typing import Callable

import numpy as np

from .im2col import conv_output_size, im2col
from .rounding import ort_round

__all__ = ["GOLDEN_OPS", "HOST_OPS", "golden_op", "quantize", "dequantize", "requantize",
           "qconv", "qdense", "qavgpool", "window_counts", "qmaxpool", "qadd", "qconcat",
           "qeltwise", "eltwise_acc", "softmax", "accumulate_bound", "accumulate_span",
           "lookup"]

#: Operators that :func:`hwonnx.quant.quantize_graph` itself leaves on the host (NumPy float32)
#: after the accelerator's output. Host steps in general, before and after the accelerator,
#: are :data:`hwonnx.golden.host.HOST_FUNCTIONS`.
HOST_OPS = frozenset({"Softmax"})

GOLDEN_OPS: "dict[str, Callable[..., np.ndarray]]" = {}

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
#: Float types in which integers below a magnitude are exact, narrowest first.
_EXACT_FLOATS = ((np.float32, 1 << 24), (np.float64, 1 << 53))


def golden_op(op: str):
    def register(fn):
        GOLDEN_OPS[op] = fn
        return fn
    return register


@golden_op("Quantize")
def quantize(x: np.ndarray, *, scale: float, zero_point: int, lo: int = -128, hi: int = 127,
             sign: str = "") -> np.ndarray:
    """``clamp(round_half_even(x / scale) + zero_point, lo, hi)`` in float32 (the host's
    input conversion; the same rule as ONNX ``QuantizeLinear``, clamped to the input's range:
    all of int8 unless the model quantizes the input to fewer bits or a narrow range). A
    quotient beyond float32 (a tiny scale) is an infinity, which the clamp saturates, as
    ``QuantizeLinear`` does. With ``sign`` (a bipolar input): ``1`` where ``x >= 0``
    (``sign="x"``, QONNX ``BipolarQuant``) or ``x / scale >= 0`` in float32 (``"x/scale"``, a
    1-bit signed ``Quant``: a tiny negative ``x`` may divide to ``-0.0``), else ``-1`` (NaN
    included), plus ``zero_point``."""
    x = np.asarray(x, dtype=np.float32)
    if sign:
        with np.errstate(over="ignore", under="ignore"):
            test = x if sign == "x" else x / np.float32(scale)
        return (np.where(test >= 0, 1, -1) + zero_point).astype(np.int8)
    with np.errstate(over="ignore"):
        q = np.rint(x / np.float32(scale)) + zero_point
    return np.clip(q, lo, hi).astype(np.int8)


@golden_op("Dequantize")
def dequantize(q: np.ndarray, *, scale: float, zero_point: int) -> np.ndarray:
    """``(q - zero_point) * scale`` in float32 (the host's output conversion)."""
    return ((q.astype(np.int32) - zero_point).astype(np.float32) * np.float32(scale))


def requantize(acc: np.ndarray, bias: np.ndarray, mult: np.ndarray, shift: np.ndarray,
               zero_point: int, lo: int, hi: int, rounding: str = "half_up") -> np.ndarray:
    """Requantize int32 accumulators (channel on the last axis) to int8.

    ``v = wrap32(acc + bias)``; ``y = clamp(((v * mult) + 2**(shift-1)) >> shift + zero_point,
    lo, hi)`` with an arithmetic shift (rounding half up, toward +inf), ``mult`` in
    ``[0, 2**31)`` and ``shift`` in ``[1, 63]``. ``lo`` is raised to the zero point for a fused
    ReLU. With ``rounding="ort"``, ``v * mult * 2**-shift`` is rounded as onnxruntime's float32
    arithmetic rounds it (:func:`hwonnx.golden.rounding.ort_round`).
    """
    v = np.add(acc, bias, dtype=np.int64)
    if v.size and (v.min() < INT32_MIN or v.max() > INT32_MAX):     # (else the identity)
        v = ((v - INT32_MIN) % (1 << 32)) + INT32_MIN       # int32 wrap-around
    if rounding == "ort":
        scaled = ort_round(v, mult, shift)
        return np.clip(scaled + zero_point, lo, hi).astype(np.int8)
    # in place, v being this function's own: ((v * mult >> (shift - 1)) + 1) >> 1, which
    # is (v * mult + 2**(shift-1)) >> shift
    np.multiply(v, mult.astype(np.int64), out=v)
    np.right_shift(v, shift.astype(np.int64) - 1, out=v)
    v += 1
    np.right_shift(v, 1, out=v)
    v += zero_point
    return np.clip(v, lo, hi, out=v).astype(np.int8)


def lookup(y: np.ndarray, table) -> np.ndarray:
    """The activation table of a layer (its ``table`` attribute: 256 int8 values, entry
    ``i`` for the requantized value ``i - 128``) applied to its int8 output ``y``."""
    return np.asarray(table, dtype=np.int8)[y.astype(np.int16) + 128]


def accumulate_bound(w: np.ndarray, in_zp: "int | None" = None) -> np.ndarray:
    """Largest possible |sum_k (a_k - zp) * w_k| per output channel (``w``: ``[N, K]``) for
    int8 ``a``: ``sum |w|`` times the largest ``|a - zp|``, ``max(zp + 128, 127 - zp)`` for
    the zero point ``in_zp`` (255 for any zero point when it is None)."""
    return accumulate_span(in_zp) * np.abs(w.astype(np.int64)).sum(axis=1)


def accumulate_span(in_zp: "int | None" = None) -> int:
    """The largest ``|a - in_zp|`` of an int8 ``a`` (:func:`accumulate_bound`)."""
    return 255 if in_zp is None else max(int(in_zp) + 128, 127 - int(in_zp))


def _accumulate(patches: np.ndarray, w: np.ndarray, in_zp: int) -> np.ndarray:
    """``(patches - in_zp) @ w.T`` in int64. Where no sum of products can reach 2**24
    (2**53), float32 (float64) holds every product and partial sum exactly, whatever the
    order of the additions, so the product runs in BLAS (integer matmul in NumPy does not):
    a sum over ``k`` is at most ``max |patches - in_zp|`` times the largest ``sum_k |w|`` of
    an output channel (int8 operands: float64 for any layer, float32 for most). The samples'
    patches are one matrix: one BLAS call instead of one per sample (the calibration check
    of ResNet-18 on 32 samples: 10.9 s -> 3.2 s in this function)."""
    w, in_zp, bound = w.astype(np.int64), int(in_zp), 0
    if patches.size and w.size:
        span = max(abs(int(patches.min()) - in_zp), abs(int(patches.max()) - in_zp))
        bound = span * int(np.abs(w).sum(axis=1).max())
    exact = next((dtype for dtype, limit in _EXACT_FLOATS if bound < limit), None)
    if exact is None:
        acc = (patches.astype(np.int64) - in_zp) @ w.T
    else:       # one product of 2-D matrices, not one per sample: see the docstring
        x = np.empty(patches.shape, exact)
        np.subtract(patches, exact(in_zp), out=x)
        acc = (x.reshape(-1, x.shape[-1]) @ w.astype(exact).T).astype(np.int64)
        acc = acc.reshape(*patches.shape[:-1], w.shape[0])
    if acc.size and (acc.min() < INT32_MIN or acc.max() > INT32_MAX):
        raise OverflowError("int32 accumulator overflow: the compiler's bound check failed")
    return acc


@golden_op("QConv")
def qconv(x: np.ndarray, w: np.ndarray, bias: np.ndarray, mult: np.ndarray,
          shift: np.ndarray, *, in_zp: int, out_zp: int, lo: int, hi: int,
          strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group: int = 1,
          rounding: str = "half_up", pad_q: "int | None" = None, **_) -> np.ndarray:
    """int8 2-D convolution, NCHW: ``x`` ``[N, C, H, W]``, ``w`` ``[M, C / group, KH, KW]``
    (output channels ``[g M/group, (g+1) M/group)`` read input channels
    ``[g C/group, (g+1) C/group)``). Padding reads as ``in_zp`` (i.e. as real zero), or as
    ``pad_q`` (a folded constant ``Pad`` of another value)."""
    m, cg, kh, kw = w.shape
    if x.ndim != 4 or x.shape[1] != cg * group:
        raise ValueError(f"QConv reads x of shape {list(x.shape)}; weights {list(w.shape)} in "
                         f"{group} group(s) need [N, {cg * group}, H, W]")
    n, c, h, wd = x.shape
    mg = m // group
    accs = []
    for g in range(group):
        patches = im2col(x[:, g * cg:(g + 1) * cg], (kh, kw), strides, pads, dilations,
                         pad_value=np.int8(in_zp if pad_q is None else pad_q))
        accs.append(_accumulate(patches, w[g * mg:(g + 1) * mg].reshape(mg, -1), in_zp))
    acc = np.concatenate(accs, axis=-1)                        # [N, OH*OW, M]
    y = requantize(acc, bias, mult, shift, out_zp, lo, hi, rounding)
    top, left, bottom, right = pads
    oh = (h + top + bottom - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + left + right - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    return y.transpose(0, 2, 1).reshape(n, m, oh, ow)


@golden_op("QDense")
def qdense(x: np.ndarray, w: np.ndarray, bias: np.ndarray, mult: np.ndarray,
           shift: np.ndarray, *, in_zp: int, out_zp: int, lo: int, hi: int,
           rounding: str = "half_up", **_) -> np.ndarray:
    """int8 fully connected layer: ``x`` ``[N, K]``, ``w`` ``[K, M]`` -> ``[N, M]``."""
    if x.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"QDense reads x of shape {list(x.shape)}; weights {list(w.shape)} "
                         f"need [N, {w.shape[0]}]")
    acc = _accumulate(x, w.T, in_zp)
    return requantize(acc, bias, mult, shift, out_zp, lo, hi, rounding)


@golden_op("QAvgPool")
def qavgpool(x: np.ndarray, mult: np.ndarray, shift: np.ndarray, *, in_zp: int, out_zp: int,
             lo: int, hi: int, kernel, strides=(1, 1), pads=(0, 0, 0, 0),
             count_include_pad: bool = True, pad_q: "int | None" = None,
             rounding: str = "half_up", **_) -> np.ndarray:
    """int8 average pooling: ``sum over the window of (x - in_zp)`` (padding contributes 0),
    requantized with ``mult * 2**-shift``, which includes the division: by the window size
    (``mult``, ``shift`` ``[C]``; ONNX's ``count_include_pad=1``), or, without
    ``count_include_pad``, by the ``k`` real pixels under each window (``mult``, ``shift``
    ``[kh * kw, C]``, row ``k - 1``)."""
    c = x.shape[1]
    ones = np.ones((c, 1) + tuple(kernel), dtype=np.int8)
    if count_include_pad or mult.ndim == 1:
        return qconv(x, ones, np.zeros(c, dtype=np.int32), mult, shift, in_zp=in_zp,
                     out_zp=out_zp, lo=lo, hi=hi, strides=strides, pads=pads, group=c,
                     pad_q=pad_q, rounding=rounding)
    n, _, h, w = x.shape
    patches = im2col(x, tuple(kernel), strides, pads, (1, 1), pad_value=np.int8(in_zp))
    acc = (patches.astype(np.int64) - in_zp).reshape(n, patches.shape[1], c, -1).sum(axis=-1)
    counts = window_counts((h, w), kernel, strides, pads)                     # [OH * OW]
    y = requantize(acc, np.zeros(c, dtype=np.int32), mult[counts - 1], shift[counts - 1],
                   out_zp, lo, hi, rounding)
    oh, ow = conv_output_size(h, kernel[0], strides[0], pads[0], pads[2], 1), \
        conv_output_size(w, kernel[1], strides[1], pads[1], pads[3], 1)
    return y.transpose(0, 2, 1).reshape(n, c, oh, ow)


def window_counts(size, kernel, strides, pads) -> np.ndarray:
    """The number of real (unpadded) pixels under each pooling window, output pixels in
    row-major order."""
    inside = np.ones((1, 1) + tuple(size), dtype=np.int8)
    return im2col(inside, tuple(kernel), strides, pads, (1, 1)).sum(axis=-1)[0].astype(
        np.int64)


@golden_op("QMaxPool")
def qmaxpool(x: np.ndarray, mult: np.ndarray, shift: np.ndarray, *, in_zp: int, out_zp: int,
             lo: int, hi: int, kernel, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1),
             pad_q: "int | None" = None, **_) -> np.ndarray:
    """int8 max pooling: ``max over the window of x`` (padding reads as -128, so it never
    wins over a real value, or as ``pad_q`` for a folded constant ``Pad``), then
    ``requantize(max - in_zp, 0, mult, shift, out_zp, lo, hi)`` per channel (the identity
    ``mult = 2**30, shift = 30`` with ``out_zp = in_zp`` copies)."""
    n, c, h, wd = x.shape
    kh, kw = kernel
    patches = im2col(x, (kh, kw), strides, pads, dilations,
                     pad_value=np.int8(-128 if pad_q is None else pad_q))
    window = patches.reshape(n, patches.shape[1], c, kh * kw).max(axis=-1)   # [N, L, C]
    y = requantize(window.astype(np.int64) - in_zp, np.zeros(c, dtype=np.int32), mult, shift,
                   out_zp, lo, hi)
    oh = conv_output_size(h, kh, strides[0], pads[0], pads[2], dilations[0])
    ow = conv_output_size(wd, kw, strides[1], pads[1], pads[3], dilations[1])
    return y.transpose(0, 2, 1).reshape(n, c, oh, ow)


@golden_op("QAdd")
def qadd(a: np.ndarray, b: np.ndarray, mult: np.ndarray, shift: np.ndarray, *, wa: int,
         wb: int, za: int, zb: int, out_zp: int, lo: int, hi: int, **_) -> np.ndarray:
    """Sum of two int8 tensors with different scales: ``wa (a - za) + wb (b - zb)`` with
    int8 weights ``wa``, ``wb`` in the ratio of the two input scales, requantized per
    channel (channel axis 1)."""
    acc = wa * (a.astype(np.int64) - za) + wb * (b.astype(np.int64) - zb)
    moved = np.moveaxis(acc, 1, -1)
    y = requantize(moved, np.zeros(moved.shape[-1], dtype=np.int32), mult, shift, out_zp, lo,
                   hi)
    return np.moveaxis(y, -1, 1)


#: ``QEltwise`` modes: how the two products of a lane are combined.
ELTWISE_MODES = ("sum", "max", "min")


def eltwise_acc(a: np.ndarray, b: np.ndarray, *, mode: str, mul: bool, ka: int, kb: int,
                za: int, zb: int) -> np.ndarray:
    """The accumulators of :func:`qeltwise` (int64; int32 by the bound ``255 (|ka| + |kb|)``,
    or ``255**2`` with ``mul``)."""
    if mode not in ELTWISE_MODES:
        raise ValueError(f"QEltwise mode {mode!r} is not one of {ELTWISE_MODES}")
    da, db = a.astype(np.int64) - za, b.astype(np.int64) - zb
    p = da * ka
    q = np.broadcast_to(da * db if mul else db * kb, p.shape)
    acc = p + q if mode == "sum" else np.maximum(p, q) if mode == "max" else np.minimum(p, q)
    if acc.size and (acc.min() < INT32_MIN or acc.max() > INT32_MAX):
        raise OverflowError("int32 accumulator overflow: the quantizer's bound check failed")
    return acc


@golden_op("QEltwise")
def qeltwise(a: np.ndarray, b: np.ndarray, mult: np.ndarray, shift: np.ndarray, *,
             mode: str, mul: bool, ka: int, kb: int, za: int, zb: int, out_zp: int, lo: int,
             hi: int, **_) -> np.ndarray:
    """Binary element-wise operator of two int8 tensors with their own scales and zero points
    (the element-wise engine, ``hdl/eltwise.py``), ``b`` broadcast against ``a`` (NumPy
    rules; the compiler maps equal shapes and ``b`` of shape ``[1, C, 1, 1]``):

    ``p = (a - za) * ka``, ``q = (a - za) * (b - zb)`` if ``mul`` else ``(b - zb) * kb``, and
    the accumulator ``p + q`` (``mode`` ``sum``), ``max(p, q)`` or ``min(p, q)``, requantized
    per channel (axis 1) with bias 0. Add/Sub: ``sum`` with ``ka``, ``kb`` in the ratio of
    the input scales (``kb < 0`` subtracts); Mul: ``sum`` with ``mul`` and ``ka = kb = 0``;
    Max/Min: the larger/smaller of the two rescaled inputs. (The engine has one multiplier
    per lane: ``p`` goes in before ``b - zb`` is there, ``q`` a cycle later; so ``mul``
    multiplies in ``q``.)"""
    acc = eltwise_acc(a, b, mode=mode, mul=mul, ka=ka, kb=kb, za=za, zb=zb)
    moved = np.moveaxis(acc, 1, -1)
    y = requantize(moved, np.zeros(moved.shape[-1], dtype=np.int32), mult, shift, out_zp, lo,
                   hi)
    return np.moveaxis(y, -1, 1)


@golden_op("QConcat")
def qconcat(*args: np.ndarray, zps, out_zp: int, lo: int, hi: int, axis: int = 1,
            **_) -> np.ndarray:
    """Concatenation of int8 tensors with their own scales: ``args`` is ``x_0, ..., x_{n-1},
    mult, shift``. Along the channel axis (``axis = 1``), output channel ``c``, taken from
    channel ``c'`` of source ``j``, is ``requantize(x_j[:, c'] - zps[j], 0, mult[c],
    shift[c], out_zp, lo, hi)`` (``mult``, ``shift``: int32 per output channel); along height
    or width (``axis`` 2 or 3), source ``j`` is requantized by row ``j`` of ``mult``,
    ``shift`` (``[sources, C]``) and the results are joined. The identity ``mult = 2**30,
    shift = 30`` copies a source whose scale and zero point are the output's."""
    *xs, mult, shift = args
    if len(xs) != len(zps):
        raise ValueError(f"QConcat has {len(xs)} inputs but {len(zps)} zero points")
    if axis != 1:
        zero = np.zeros(xs[0].shape[1], dtype=np.int32)
        parts = [np.moveaxis(requantize(np.moveaxis(x.astype(np.int64) - int(z), 1, -1), zero,
                                        m, s, out_zp, lo, hi), -1, 1)
                 for x, z, m, s in zip(xs, zps, mult, shift)]
        return np.concatenate(parts, axis=axis)
    acc = np.concatenate([x.astype(np.int64) - int(z) for x, z in zip(xs, zps)], axis=1)
    moved = np.moveaxis(acc, 1, -1)
    y = requantize(moved, np.zeros(moved.shape[-1], dtype=np.int32), mult, shift, out_zp, lo,
                   hi)
    return np.moveaxis(y, -1, 1)


@golden_op("QSlice")
def qslice(x: np.ndarray, mult: np.ndarray, shift: np.ndarray, *, in_zp: int, out_zp: int,
           lo: int, hi: int, starts, out_shape=None, **_) -> np.ndarray:
    """The window of ``x`` from ``starts`` (channel, row, column; or feature) of ``out_shape``
    (without the batch), ``x - in_zp`` requantized per channel (the identity ``2**30 *
    2**-30`` copies it)."""
    window = tuple(slice(s, s + n) for s, n in zip(starts, out_shape))
    part = x[(slice(None),) + window].astype(np.int64) - in_zp
    y = requantize(np.moveaxis(part, 1, -1), np.zeros(part.shape[1], dtype=np.int32), mult,
                   shift, out_zp, lo, hi)
    return np.moveaxis(y, -1, 1)


@golden_op("QPermute")
def qpermute(x: np.ndarray, mult: np.ndarray, shift: np.ndarray, *, in_zp: int, out_zp: int,
             lo: int, hi: int, perm, **_) -> np.ndarray:
    """``x`` transposed by ``perm`` (batch axis first and in place), ``x - in_zp`` requantized
    per output channel (the identity ``2**30 * 2**-30`` copies it)."""
    part = np.transpose(x, perm).astype(np.int64) - in_zp
    y = requantize(np.moveaxis(part, 1, -1), np.zeros(part.shape[1], dtype=np.int32), mult,
                   shift, out_zp, lo, hi)
    return np.moveaxis(y, -1, 1)


@golden_op("QChannelPermute")
def qchannel_permute(x: np.ndarray, mult: np.ndarray, shift: np.ndarray, *, in_zp: int,
                     out_zp: int, lo: int, hi: int, channels, **_) -> np.ndarray:
    """Output channel ``c`` is input channel ``channels[c]`` of the ``[N, C, H, W]`` ``x``,
    ``x - in_zp`` requantized per output channel (the identity ``2**30 * 2**-30`` copies
    it)."""
    order = np.asarray(channels, dtype=np.int64)
    if order.ndim != 1 or x.ndim != 4 or sorted(order.tolist()) != list(range(x.shape[1])):
        raise ValueError(f"QChannelPermute of channels {order.tolist()} on a value of shape "
                         f"{list(x.shape)}: the channels must be a permutation of its axis 1")
    part = x[:, order].astype(np.int64) - in_zp
    y = requantize(np.moveaxis(part, 1, -1), np.zeros(part.shape[1], dtype=np.int32), mult,
                   shift, out_zp, lo, hi)
    return np.moveaxis(y, -1, 1)


@golden_op("Softmax")
def softmax(x: np.ndarray, *, axis: int = -1, **_) -> np.ndarray:
    """Host operator (float32): softmax along ``axis``."""
    x = np.asarray(x, dtype=np.float32)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(np.float32)


def _samples(op: str, x: np.ndarray, shape) -> None:
    """Check that the batch ``x`` of a layout op holds samples that ``shape`` (the batch-1
    IR shape, leading 1) can take: the samples run along axis 0, and must never mix."""
    per_sample = int(np.prod(x.shape[1:], dtype=np.int64))
    if not shape or shape[0] != 1 or int(np.prod(shape, dtype=np.int64)) != per_sample:
        raise ValueError(f"{op} to {list(shape)} of samples of shape {[1, *x.shape[1:]]}: the "
                         f"result must be one sample of the same size along a leading axis "
                         f"of 1")


@golden_op("Flatten")
def flatten(x: np.ndarray, *, axis: int = 1, **_) -> np.ndarray:
    """ONNX ``Flatten`` of each sample (``[1, ...]``) to ``[1, K]``, samples kept apart along
    axis 0 (at batch 1, ``axis`` 0 and 1 both give ``[1, K]``; a larger ``axis`` must leave
    a leading 1)."""
    sample = (1, *x.shape[1:])
    lead = int(np.prod(sample[:axis], dtype=np.int64))
    _samples("Flatten", x, (lead, int(np.prod(sample[axis:], dtype=np.int64))))
    return x.reshape(x.shape[0], -1)


@golden_op("Reshape")
def reshape(x: np.ndarray, *, shape, **_) -> np.ndarray:
    """Each sample (``[1, ...]``) reshaped to ``shape`` (leading 1), samples along axis 0."""
    _samples("Reshape", x, tuple(shape))
    return x.reshape((x.shape[0],) + tuple(shape)[1:])
