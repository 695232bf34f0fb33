"""onnxruntime's requantization rounding as integer arithmetic (the ``"ort"`` rounding of
:func:`hwonnx.golden.ops.requantize`, computed by ``hdl/rounding.py``).

onnxruntime's int8 kernels compute ``round_half_even(float32(float32(v) * M))``. With
``M = mult * 2**-shift`` held exactly by a float32 (``mult`` with at most 24 significant
bits), that is ``sign(v) * rne(rne24(rne24(|v|) * mult) / 2**shift)``, where ``rne24`` rounds
to 24 significant bits and ``rne`` to an integer, both with ties to even. For any other
``mult`` this is still a well-defined integer function, and the hardware computes exactly it.
"""

import numpy as np

__all__ = ["ort_round"]

_ONE = np.uint64(1)


def _bit_length(x: np.ndarray) -> np.ndarray:
    length = np.zeros(x.shape, dtype=np.int64)
    rest = x.copy()
    for step in (32, 16, 8, 4, 2, 1):
        big = (rest >> np.uint64(step)) != 0
        length += big * step
        rest = np.where(big, rest >> np.uint64(step), rest)
    return length + (rest != 0)


def _round_low_bits(x: np.ndarray, drop: np.ndarray) -> np.ndarray:
    """``x`` (uint64, below 2**63) with its ``drop`` lowest bits rounded away, ties to even,
    at its scale."""
    d = drop.astype(np.uint64)
    mask = (_ONE << d) - _ONE
    rest, half = x & mask, (mask + _ONE) >> _ONE
    odd = ((x >> d) & _ONE) == _ONE
    up = (d > 0) & ((rest > half) | ((rest == half) & odd))
    return (x & ~mask) + np.where(up, mask + _ONE, np.uint64(0))


def ort_round(v: np.ndarray, mult: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """``round_half_even(float32(float32(v) * mult * 2**-shift))`` for int32 ``v``, ``mult``
    in ``[0, 2**31)`` and ``shift`` in ``[1, 63]`` (broadcast), as int64."""
    v = np.asarray(v, dtype=np.int64)
    magnitude = np.abs(v).astype(np.uint64)
    a = _round_low_bits(magnitude, np.maximum(_bit_length(magnitude) - 24, 0))
    product = a * np.asarray(mult, dtype=np.int64).astype(np.uint64)
    p = _round_low_bits(product, np.maximum(_bit_length(product) - 24, 0))
    s = np.broadcast_to(np.asarray(shift, dtype=np.int64), p.shape).astype(np.uint64)
    low = (_ONE << s) - _ONE
    quotient, rest, half = p >> s, p & low, (low + _ONE) >> _ONE
    up = (rest > half) | ((rest == half) & ((quotient & _ONE) == _ONE))
    rounded = (quotient + up).astype(np.int64)
    return np.where(v < 0, -rounded, rounded)
