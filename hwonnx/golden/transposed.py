"""Transposed convolution (ONNX ``ConvTranspose``, and nearest upsampling as one), by its
definition: every input pixel scatters its kernel-weighted values into the output.

``w`` is in convolution layout ``[M, C / group, KH, KW]`` (the frontend moves ONNX's ``[C,
M / group, KH, KW]`` there): output channel ``m`` of group ``g`` reads input channels ``[g C /
group, (g + 1) C / group)``, and input pixel ``i`` adds ``x[c, i] w[m, c', k]`` to output pixel
``o = i * stride + k - pad_begin`` (per spatial axis; outputs outside ``[0, out)`` are dropped).
"""

import numpy as np

from .ops import INT32_MAX, INT32_MIN, golden_op, requantize

__all__ = ["scatter", "qconv_transpose"]


def scatter(x: np.ndarray, w: np.ndarray, strides, pads, out_hw, group: int) -> np.ndarray:
    """The transposed convolution of ``x`` ``[N, C, H, W]`` with ``w`` (module docstring), in
    ``x``'s dtype (exact for integers), ``[N, M, out_h, out_w]``; no bias."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    mg = m // group
    (sy, sx), (top, left) = strides, pads[:2]
    out_h, out_w = out_hw
    # the full scatter is [N, M, (H-1) sy + KH, (W-1) sx + KW], then shifted by the pads
    full_h = max((h - 1) * sy + kh, top + out_h)
    full_w = max((wd - 1) * sx + kw, left + out_w)
    y = np.zeros((n, m, full_h, full_w), dtype=x.dtype)
    for g in range(group):
        xg = x[:, g * cg:(g + 1) * cg]
        wg = w[g * mg:(g + 1) * mg]
        for ky in range(kh):
            for kx in range(kw):
                part = np.einsum("nchw,mc->nmhw", xg, wg[:, :, ky, kx])
                y[:, g * mg:(g + 1) * mg, ky:ky + (h - 1) * sy + 1:sy,
                  kx:kx + (wd - 1) * sx + 1:sx] += part
    return y[:, :, top:top + out_h, left:left + out_w]


@golden_op("QConvTranspose")
def qconv_transpose(x: np.ndarray, w: np.ndarray, bias: np.ndarray, mult: np.ndarray,
                    shift: np.ndarray, *, in_zp: int, out_zp: int, lo: int, hi: int,
                    strides, pads, out_hw, group: int = 1, rounding: str = "half_up",
                    **_) -> np.ndarray:
    """int8 transposed convolution: ``acc = scatter(x - in_zp, w)`` (int64, checked against
    int32), then the per-channel requantization of :func:`~.ops.requantize`."""
    acc = scatter(x.astype(np.int64) - in_zp, w.astype(np.int64), strides, pads, out_hw,
                  group)
    if acc.size and (acc.min() < INT32_MIN or acc.max() > INT32_MAX):
        raise OverflowError("int32 accumulator overflow: the compiler's bound check failed")
    n, m, oh, ow = acc.shape
    y = requantize(acc.reshape(n, m, -1).transpose(0, 2, 1), bias, mult, shift, out_zp, lo,
                   hi, rounding)
    return y.transpose(0, 2, 1).reshape(n, m, oh, ow)
