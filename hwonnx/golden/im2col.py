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


def _taps(size: int, out: int, stride: int, offset: int) -> "tuple[int, int, int]":
    """Return ``(first, last + 1, first input index)`` of the outputs ``o`` whose tap
    ``o * stride + offset`` lies inside ``[0, size)``."""
    first = max(0, -(offset // stride))
    end = min(out, (size - 1 - offset) // stride + 1) if offset < size else 0
    return first, max(first, end), first * stride + offset


def im2col(x: np.ndarray, kernel: "tuple[int, int]", strides: "tuple[int, int]",
           pads: "tuple[int, int, int, int]", dilations: "tuple[int, int]",
           pad_value=0) -> np.ndarray:
    """Return the patches of ``x`` (``[N, C, H, W]``) as ``[N, OH*OW, C*KH*KW]``.

    ``pads`` is ONNX order ``(top, left, bottom, right)``; padded positions hold ``pad_value``
    (the input zero point for quantized data). The patch axis is ordered ``(c, ky, kx)``, the
    order of ONNX's ``[M, C, KH, KW]`` weights flattened. The padded input is never built:
    the patches are the only array made, whatever the padding.

    Raises
    ------
    ValueError
        If the output would be empty (the dilated kernel is larger than the padded input);
        callers check this first (the frontend refuses such a node by name).
    """
    n, c, h, w = x.shape
    kh, kw = kernel
    sy, sx = strides
    top, left, bottom, right = pads
    dy, dx = dilations
    oh = conv_output_size(h, kh, sy, top, bottom, dy)
    ow = conv_output_size(w, kw, sx, left, right, dx)
    if oh < 1 or ow < 1:
        raise ValueError(f"im2col: a {kh}x{kw} kernel with dilations {[dy, dx]} does not fit "
                         f"the {h}x{w} input padded by {list(pads)} (output {oh}x{ow})")
    cols = np.full((n, c, kh, kw, oh, ow), pad_value, dtype=x.dtype)
    for ky in range(kh):
        y_first, y_end, y0 = _taps(h, oh, sy, ky * dy - top)
        for kx in range(kw):
            x_first, x_end, x0 = _taps(w, ow, sx, kx * dx - left)
            if y_first < y_end and x_first < x_end:
                cols[:, :, ky, kx, y_first:y_end, x_first:x_end] = x[
                    :, :, y0:y0 + sy * (y_end - y_first - 1) + 1:sy,
                    x0:x0 + sx * (x_end - x_first - 1) + 1:sx]
    return cols.reshape(n, c * kh * kw, oh * ow).transpose(0, 2, 1)
