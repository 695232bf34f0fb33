"""A transposed convolution as ordinary convolutions, one per output phase.

Along an axis with stride ``s``, kernel ``K`` and begin padding ``pb``, output pixel ``o``
receives ``x[i] w[k]`` for ``o = i s + k - pb``. The outputs of one *phase* ``p = (o + pb) mod
s`` are ``o = s q + p - pb`` and read only the taps ``k = p + s j``:

    y[s q + p - pb] = sum_j x[q - j] w[p + s j],   j = 0 .. J - 1,   J = ceil((K - p) / s)

which is a stride-1 convolution with the flipped sub-kernel ``v[t] = w[p + s (J - 1 - t)]``:
its output ``m`` (``q = q0 + m``, ``q0`` the phase's first ``q`` inside the output) reads ``x[m
+ t - (J - 1 - q0)]``, so its begin padding is ``J - 1 - q0`` (negative: the window starts
inside the input). Its outputs go to every ``s``-th output pixel from ``s q0 + p - pb``: the
POSTs write with a stride (:attr:`Phase.scatter`). A phase without taps (``K < s``) outputs
its bias: one zero tap keeps it a convolution. The golden model computes the transposed
convolution by its definition (:mod:`hwonnx.golden.transposed`); the sum of the phases equals
it exactly, because every product lands in exactly one phase.
"""

from dataclasses import dataclass
from itertools import product

import numpy as np

__all__ = ["Phase", "phases"]


@dataclass(frozen=True)
class Phase:
    """One phase: a convolution (``weight`` ``[M, C / group, JH, JW]``, stride 1, ``pads``
    ``(top, left, bottom, right)`` with top/left possibly negative, ``out_hw`` pixels) whose
    output pixel ``(y, x)`` is pixel ``(sy y + oy, sx x + ox)`` of the layer's output, of
    width ``width``: ``scatter = (sy, sx, oy, ox, width)``; ``taps``: its kernel taps of the
    layer's kernel (0: it outputs its bias)."""
    name: str
    weight: np.ndarray
    pads: "tuple[int, int, int, int]"
    out_hw: "tuple[int, int]"
    scatter: "tuple[int, int, int, int, int]"
    taps: int


def _axis(s: int, k: int, pb: int, length: int, out: int):
    """Per phase along one axis: ``(p, taps, pad_begin, pad_end, count, offset)``; ``taps``
    lists the kernel indices of the sub-kernel in order (empty: no taps)."""
    result = []
    for p in range(s):
        q0 = -((p - pb) // s)                       # ceil((pb - p) / s)
        count = (out - 1 + pb - p) // s - q0 + 1
        if count <= 0:
            continue
        j = max(0, -(-(k - p) // s))
        taps = [p + s * (j - 1 - t) for t in range(j)]
        width = max(j, 1)
        begin = width - 1 - q0 if j else -q0
        end = max(0, (count - 1) + (width - 1) - begin - (length - 1))
        result.append((p, taps, begin, end, count, s * q0 + p - pb))
    return result


def phases(w: np.ndarray, strides, pads, in_hw, out_hw) -> "list[Phase]":
    """The phases of a transposed convolution with convolution-layout weights ``w`` ``[M, C /
    group, KH, KW]`` (see the module docstring)."""
    (sy, sx), (kh, kw) = strides, w.shape[2:]
    rows = _axis(sy, kh, pads[0], in_hw[0], out_hw[0])
    cols = _axis(sx, kw, pads[1], in_hw[1], out_hw[1])
    result = []
    for (py, ty, by, ey, ch, oy), (px, tx, bx, ex, cw, ox) in product(rows, cols):
        weight = np.zeros(w.shape[:2] + (max(len(ty), 1), max(len(tx), 1)), dtype=w.dtype)
        if ty and tx:
            weight[:] = w[:, :, ty][:, :, :, tx]
        result.append(Phase(f"phase {py},{px}", weight, (by, bx, ey, ex), (ch, cw),
                            (sy, sx, oy, ox, out_hw[1]), len(ty) * len(tx)))
    return result
