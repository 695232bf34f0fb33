"""Depthwise streaming: depthwise convolutions and average pooling with the channels across
the array's columns and the kernel's columns down its rows.

On the default mapping a depthwise K tile (one kernel tap of one channel block) has one
non-zero weight per column, so only one PE in each column does useful work. Streaming mode
(MATMUL ``dw``, ``docs/architecture.md``) instead feeds every column ``c`` its own lane
``c`` (channel ``n0 + c``): the words stream along one input row, row ``r`` of column ``c``
multiplies the word ``r`` positions later by ``w[c, ky, r / dx]``, and the column sum of
word ``j`` is the kernel row ``ky`` applied at input column ``j`` -- a 1-D convolution per
channel. Every ``sx``-th word up to ``(OW - 1) sx`` is an output pixel; the ``KH`` kernel rows
are the K tiles, accumulated as usual. ``KW`` rows of ``rows`` columns do useful work
(``KW / cols`` of the array for ``sx = 1``, against ``1 / cols``), for ``L`` words per
output row and kernel row instead of ``KW`` words per output pixel, and ``KW`` times fewer
K tiles: a layer streams only when that is cheaper (:func:`streams`; a 1-wide kernel with a
stride along the rows is not).
"""

import numpy as np

from ..config import ArchConfig
from ..isa import Op
from .loops import Tile

__all__ = ["streams", "emit_depthwise"]


def streams(spec, config: ArchConfig) -> bool:
    """Whether a layer is computed in streaming mode: depthwise (not max pooling), the
    kernel's width (dilated) within the rows, the columns covering a channel block, an
    output row within half the accumulators, and cheaper than the default mapping by the
    cycle model's rule of thumb (a K tile takes ``max(count, max(rows, cols) + 1)``
    cycles: the loader's turnaround bounds short tiles)."""
    if not spec.depthwise or spec.pool_max or len(spec.sources) != 1:
        return False
    kh, kw = spec.phys.shape[1:3]
    (oh, ow), dx = spec.out_hw, spec.dilations[1]
    length = (ow - 1) * spec.strides[1] + (kw - 1) * dx + 1
    if not (config.cols >= config.rows and (kw - 1) * dx + 1 <= config.rows
            and ow <= config.acc_half and length < 1 << 16 and spec.strides[1] < 1 << 8):
        return False
    turnaround = max(config.rows, config.cols) + 1
    tile_rows = _tile_rows(oh, ow, length, config)
    streamed = kh * sum(max(min(tile_rows, oh - y) * length, turnaround)
                        for y in range(0, oh, tile_rows))
    pixels, m_tile = oh * ow, min(oh * ow, config.acc_half)
    default = kh * kw * sum(max(min(m_tile, pixels - m0), turnaround)
                            for m0 in range(0, pixels, m_tile))
    return streamed < default


def _tile_rows(oh: int, ow: int, length: int, config: ArchConfig) -> int:
    """Output rows per M tile: within half the accumulators, ``count`` within 16 bits."""
    return min(oh, config.acc_half // ow, 0xFFFF // length)


def emit_depthwise(builder, spec, folded: np.ndarray, target, lut: int
                   ) -> "tuple[int, int, int, int, int]":
    """Emit the tiles of a streaming depthwise layer into ``builder`` (a
    :class:`~hwonnx.compiler.lower._Builder`): N tiles of one channel block, M tiles of whole
    output rows, one K tile per kernel row; returns their nest ``(M, N, K1, K2, K3)``."""
    cfg, rows, cols = builder.config, builder.config.rows, builder.config.cols
    n_out, kh, kw = spec.phys.shape[:3]
    oh, ow = spec.out_hw
    (sy, sx), (dy, dx) = spec.strides, spec.dilations
    pt, pl = spec.pads[0], spec.pads[1]
    src = spec.sources[0]
    length = (ow - 1) * sx + (kw - 1) * dx + 1          # words per output row
    n_tiles = [(n0, min(rows, n_out - n0)) for n0 in range(0, n_out, rows)]
    par_addr = builder.params(spec, folded, n_tiles)
    tile_addr = {}
    for n0, nt in n_tiles:
        channels = n0 + np.arange(nt)
        for ky in range(kh):
            padded = np.zeros((rows, cols), dtype=np.int64)
            for kx in range(kw):
                padded[kx * dx, :nt] = spec.phys[channels, ky, kx, channels]
            tile_addr[n0, ky] = builder.weight_tile(padded)
    first_of_layer = True
    tile_rows = _tile_rows(oh, ow, length, cfg)
    for oy0 in range(0, oh, tile_rows):
        rows_here = min(tile_rows, oh - oy0)
        for n_index, (n0, nt) in enumerate(n_tiles):
            acc_base = (builder.output_tiles % 2) * cfg.acc_half
            builder.output_tiles += 1
            for ky in range(kh):
                iy0, ix0 = oy0 * sy + ky * dy - pt, -pl
                address = src.base + (iy0 * src.iw + ix0) * src.cb + n0 // rows
                matmul = dict(
                    op=Op.MATMUL, wait=int(first_of_layer), first=int(ky == 0),
                    count=rows_here * length, wgt_addr=tile_addr[n0, ky], acc_addr=acc_base,
                    act_addr=address, act_row=address, ow=length, ox0=0, ih=src.ih,
                    iw=src.iw, iy0=iy0, ix0=ix0, ixr=ix0, sy=sy, sx=1, step_x=src.cb,
                    step_y=sy * src.iw * src.cb, zp=spec.padding(src), dw=1, vstride=sx,
                    vlast=(ow - 1) * sx, wpack=builder.wpack)
                first_of_layer = False
                posts = []
                if ky == kh - 1:
                    posts = builder.posts(spec, target, acc_base, (oy0 * ow, rows_here * ow),
                                          (n0, nt), par_addr, n_index, lut)
                builder.tiles.append(Tile(matmul, posts))
    return -(-oh // tile_rows), len(n_tiles), kh, 1, 1

