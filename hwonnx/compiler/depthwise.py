"""Depthwise streaming: depthwise convolutions and average pooling with the channels across
the array's columns and the kernel's columns down its rows.

On the default mapping a depthwise K tile (one kernel tap of one channel block) has one
non-zero weight per column, so only one PE in each column does useful work. Streaming mode
(MATMUL ``dw``, ``docs/architecture.md``) instead feeds every column ``c`` its own lane
``c`` (channel ``n0 + c``): the words stream along input rows, row after row, and row ``r``
of column ``c`` multiplies the word ``r`` positions later, so the column sum of word ``j``
applies the weights down the column to the ``rows`` words from ``j`` on -- a 1-D
convolution per channel, and, where the image is narrow, several kernel rows at once (weight
row ``D*t + kx`` reaches stream row ``t`` below, :class:`_Stream`). Every ``sx``-th word up
to ``(OW - 1) sx`` of a stream row is an output pixel; the passes (groups of kernel rows)
are the K tiles, accumulated as usual. A layer streams only when that is cheaper than the
default mapping (:func:`streams`; a 1-wide kernel with a stride along the rows is not).
"""

import numpy as np

from ..config import ArchConfig
from .micro import MatMul

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
    if not (config.cols >= config.rows and (kw - 1) * dx + 1 <= config.rows
            and spec.strides[1] < 1 << 8):
        return False
    stream = _Stream(spec, config)
    if stream.tile_rows < 1:
        return False
    turnaround = max(config.rows, config.cols) + 1
    streamed = len(stream.passes) * sum(
        max(stream.count(min(stream.tile_rows, oh - y)), turnaround)
        for y in range(0, oh, stream.tile_rows))
    pixels, m_tile = oh * ow, min(oh * ow, config.acc_half)
    default = kh * kw * sum(max(min(m_tile, pixels - m0), turnaround)
                            for m0 in range(0, pixels, m_tile))
    return streamed < default


class _Stream:
    """The geometry of a streamed layer.

    The words of one MATMUL run along input rows of ``D`` words each (input columns
    ``-pad_left ... D - pad_left - 1``), row after row, as the feeder walks them. Row ``r`` of
    column ``c`` multiplies lane ``c`` of the word ``r`` positions later, so weight row
    ``D*t + kx*dx`` reaches the same column ``kx*dx`` further on in the stream row ``t``
    below: one pass applies the kernel rows ``ky0 + t*sy/dy`` (``t < T``, ``D*(T - 1) +
    (KW - 1)*dx + 1 <= rows``) at once, and a narrow image needs fewer passes than kernel
    rows (KWS' 5-wide 3x3 depthwise layers one, not three, on 16 rows).

    ``D = max(iw + pad_left, L - pad_left)`` with ``L`` the words an output row's taps span:
    a tap that runs past the end of its stream row lands on the next row's left padding
    (a zero point), which is what the image holds there (its right padding), so the row's
    right padding is not streamed. Every pass streams ``T - 1`` rows (of the layer's largest
    ``T``) and ``L - D`` words past the last output row; the accumulator words they write lie
    beyond the tile's outputs in its half and are never read."""

    def __init__(self, spec, config: ArchConfig):
        kh, kw = spec.phys.shape[1:3]
        self.oh, self.ow = spec.out_hw
        (sy, sx), (dy, dx) = spec.strides, spec.dilations
        # one output row (a global pool): the stream may step by one input row
        self.sy = sy if self.oh > 1 else 1
        pl, iw = spec.pads[1], spec.sources[0].iw
        span = (self.ow - 1) * sx + (kw - 1) * dx + 1
        self.vlast = (self.ow - 1) * sx
        self.row = max(iw + pl, span - pl, self.vlast + 1)                   # D
        self.tail = max(0, span - self.row)              # wrapped words after the last row
        most = (config.rows - (kw - 1) * dx - 1) // self.row + 1             # T
        self.passes = _passes(kh, self.sy, dy, most)
        self.below = max(t for group in self.passes for t, _ in group)   # T - 1 rows past
        extra = self.below * self.ow + min(-(-self.tail // sx), self.ow)
        self.tile_rows = min(self.oh, (config.acc_half - extra) // self.ow,
                             (0xFFFF - self.tail) // self.row - self.below)

    def count(self, rows_here: int) -> int:
        """Words a pass over ``rows_here`` output rows streams (the same for every pass,
        so that a layer's passes form a nest)."""
        return (rows_here + self.below) * self.row + self.tail


def _passes(kh: int, sy: int, dy: int, most: int) -> "list[list[tuple[int, int]]]":
    """Kernel rows grouped into passes: each a list of ``(t, ky)``, ``t`` the stream row
    (``(ky - ky0) * dy = t * sy``, ``t < most``) on which kernel row ``ky`` is applied, ``ky0``
    the first kernel row no earlier pass applies. Takes time in proportion to ``kh * most``
    (a global pool's kernel has as many rows as its image)."""
    taken: "set[int]" = set()
    passes = []
    for ky0 in range(kh):
        if ky0 in taken:
            continue
        group = [(t, ky0 + t * sy // dy) for t in range(most) if t * sy % dy == 0
                 and ky0 + t * sy // dy < kh and ky0 + t * sy // dy not in taken]
        taken.update(ky for _, ky in group)
        passes.append(group)
    return passes


def emit_depthwise(emitter, spec, folded: np.ndarray, target, lut: int
                   ) -> "tuple[int, int, int, int, int]":
    """Emit the tiles of a streaming depthwise layer with ``emitter`` (a
    :class:`~hwonnx.compiler.emitter.TileEmitter`): N tiles of one channel block, M tiles of
    whole output rows, one K tile per pass; returns their nest ``(M, N, K1, K2, K3)``."""
    cfg, rows, cols = emitter.config, emitter.config.rows, emitter.config.cols
    n_out, kh, kw = spec.phys.shape[:3]
    oh, ow = spec.out_hw
    (sy, sx), (dy, dx) = spec.strides, spec.dilations
    pt, pl = spec.pads[0], spec.pads[1]
    src = spec.sources[0]
    stream = _Stream(spec, cfg)
    step = stream.sy                                    # input rows per stream row
    n_tiles = [(n0, min(rows, n_out - n0)) for n0 in range(0, n_out, rows)]
    par_addr = emitter.params(spec, folded, n_tiles)
    tile_addr = {}
    for n0, nt in n_tiles:
        channels = n0 + np.arange(nt)
        for p, group in enumerate(stream.passes):
            padded = np.zeros((rows, cols), dtype=np.int64)
            for t, ky in group:
                for kx in range(kw):
                    padded[t * stream.row + kx * dx, :nt] = spec.phys[channels, ky, kx,
                                                                      channels]
            tile_addr[n0, p] = emitter.weight_tile(padded)
    if emitter.dry:                                     # the images, not the tiles
        return -(-oh // stream.tile_rows), len(n_tiles), len(stream.passes), 1, 1
    first_of_layer = True
    tile_rows = stream.tile_rows
    for oy0 in range(0, oh, tile_rows):
        rows_here = min(tile_rows, oh - oy0)
        for n_index, (n0, nt) in enumerate(n_tiles):
            acc_base = emitter.output_tile()
            for p, group in enumerate(stream.passes):
                ky0 = group[0][1]
                iy0, ix0 = oy0 * sy + ky0 * dy - pt, -pl
                address = src.base + (iy0 * src.iw + ix0) * src.cb + n0 // rows
                matmul = MatMul(
                    wait=int(first_of_layer), first=int(p == 0),
                    count=stream.count(rows_here), wgt_addr=tile_addr[n0, p],
                    acc_addr=acc_base, act_addr=address, act_row=address, ow=stream.row,
                    ox0=0, ih=src.ih, iw=src.iw, iy0=iy0, ix0=ix0, ixr=ix0, sy=step, sx=1,
                    step_x=src.cb, step_y=step * src.iw * src.cb, zp=spec.padding(src), dw=1,
                    vstride=sx, vlast=stream.vlast, wpack=emitter.wpack)
                first_of_layer = False
                posts = []
                if p == len(stream.passes) - 1:
                    posts = emitter.posts(spec, target, acc_base, (oy0 * ow, rows_here * ow),
                                          (n0, nt), par_addr, n_index, lut)
                emitter.add_tile(matmul, posts)
    return -(-oh // tile_rows), len(n_tiles), len(stream.passes), 1, 1
