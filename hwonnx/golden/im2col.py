"""Patch extraction shared by the float reference and the integer golden convolution."""

import numpy as np

__all__ = ["conv_output_size", "im2col", "windows_touch_input"]


def conv_output_size(size: int, kernel: int, stride: int, pad_begin: int, pad_end: int,
                     dilation: int) -> int:
    return (size + pad_begin + pad_end - dilation * (kernel - 1) - 1) // stride + 1


def windows_touch_input(size: int, kernel: int, stride: int, pad_begin: int, pad_end: int,
                        dilation: int) -> bool:
    """Whether every window along one axis has at least one tap inside the input (a window
    entirely in the padding has no maximum to take)."""
    out = conv_output_size(size, kernel, stride, pad_begin, pad_end, dilation)
    return all(any(0 <= o * stride - pad_begin + k * dilation < size for k in range(kernel))
               for o in range(out))


def im2col(x: np.ndarray, kernel: "tuple[int, int]", strides: "tuple[int, int]",
           pads: "tuple[int, int, int, int]", dilations: "tuple[int, int]",
           pad_value=0) -> np.ndarray:
    """Return the patches of ``x`` (``[N, C, H, W]``) as ``[N, OH*OW, C*KH*KW]``.

    ``pads`` is ONNX order ``(top, left, bottom, right)``; padded positions hold ``pad_value``
    (the input zero point for quantized data). The patch axis is ordered ``(c, ky, kx)``, the
    order of ONNX's ``[M, C, KH, KW]`` weights flattened.
    """
    n, c, h, w = x.shape
    kh, kw = kernel
    sy, sx = strides
    top, left, bottom, right = pads
    dy, dx = dilations
    oh = conv_output_size(h, kh, sy, top, bottom, dy)
    ow = conv_output_size(w, kw, sx, left, right, dx)
    padded = np.full((n, c, h + top + bottom, w + left + right), pad_value, dtype=x.dtype)
    padded[:, :, top:top + h, left:left + w] = x
    cols = np.empty((n, c, kh, kw, oh, ow), dtype=x.dtype)
    for ky in range(kh):
        for kx in range(kw):
            y0, x0 = ky * dy, kx * dx
            cols[:, :, ky, kx] = padded[:, :, y0:y0 + sy * (oh - 1) + 1:sy,
                                        x0:x0 + sx * (ow - 1) + 1:sx]
    return cols.reshape(n, c * kh * kw, oh * ow).transpose(0, 2, 1)
