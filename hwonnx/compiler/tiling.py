"""How :mod:`.lower` cuts a layer into tiles: the output channels into N tiles, the output
rows into M tiles, the nest a LOOP walks, and the POSTs of an output tile; and the tiles of a
layer on the default mapping in that order (:func:`emit_tiles`; :mod:`.depthwise` emits the
streaming ones)."""

import numpy as np

from ..config import ArchConfig
from ..hdl.feeder import drain_cycles
from .micro import MatMul

__all__ = ["emit_tiles", "n_tiles", "nest", "post_runs", "tile_rows"]


def nest(k_tiles: "dict[int, list[tuple]]", m_count: int, n_count: int
          ) -> "tuple[int, int, int, int, int] | None":
    """``(M, N, K1, K2, K3)`` of tiles whose N tiles all have ``K1 K2 K3`` K tiles: kernel
    rows, kernel columns and sources, channel blocks (``K`` tuples are ``(source, ky, kx,
    block)``); None otherwise."""
    lists = list(k_tiles.values())
    if any(len(k) != len(lists[0]) for k in lists):
        return None
    k1 = len({k[1] for k in lists[0]})
    k2 = len({(k[0], k[2]) for k in lists[0]})
    k3 = len({k[3] for k in lists[0]})
    if k1 * k2 * k3 != len(lists[0]):
        return None
    return m_count, n_count, k1, k2, k3


def post_runs(counts: "np.ndarray | None", m0: int, mt: int
              ) -> "list[tuple[int, int, int | None]]":
    """The POSTs of output pixels ``m0 .. m0 + mt - 1``: (first pixel, pixels, window count),
    one for all of them, or one per run of pixels whose pooling windows hold the same number
    of real pixels (``counts``, average pooling with ``count_include_pad=0``)."""
    if counts is None:
        return [(m0, mt, None)]
    runs = []
    for m in range(m0, m0 + mt):
        k = int(counts[m])
        if runs and runs[-1][2] == k:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, k)
        else:
            runs.append((m, 1, k))
    return runs


def tile_rows(oh: int, ow: int, k_counts: "list[int]", n_tiles, config: ArchConfig) -> int:
    """Output rows per M tile: within half the accumulators, the count the cycle model's rule
    of thumb finds fastest. An output tile's MATMULs take ``max(count, turnaround)`` each; its
    POSTs are accepted once the previous tile's are done, start once its MATMULs have drained
    (queued, ``hdl/top.py``), and the next tile's MATMULs follow their acceptance. Small tiles
    shorten the last tile's POSTs, which overlap nothing, but large ones keep the POSTs from
    holding the MATMULs up. Larger tiles win ties. Without the tile walker every tile is
    stored, so a layer keeps the fewest tiles."""
    if not config.walker:
        return min(oh, config.acc_half // ow)
    rows, cols = config.rows, config.cols
    turnaround, drain = max(rows, cols) + 1, drain_cycles(config)
    nws = [(n0 + nt - 1) // rows - n0 // rows + 1 for n0, nt in n_tiles]
    best = None
    for h in range(min(oh, config.acc_half // ow), 0, -1):
        start = post_end = 0
        for y in range(0, oh, h):
            mt = min(h, oh - y) * ow
            for k, nw in zip(k_counts, nws):
                issued = start + k * max(mt, turnaround)
                accepted = max(issued, post_end)
                start = accepted + 1
                post_end = max(accepted, issued + drain) + mt * nw
        if best is None or post_end < best[0]:
            best = (post_end, h)
    return best[1]


def n_tiles(n_out: int, rows: int, cols: int, aligned: bool) -> "list[tuple[int, int]]":
    """First channel and width of each N tile: ``cols`` channels at a time, or, ``aligned``
    (max pooling), never across a block of ``rows`` input channels, so that every column
    of a K tile reads its own channel (a column without one would add a 0 to the maximum)."""
    if not aligned:
        return [(n0, min(cols, n_out - n0)) for n0 in range(0, n_out, cols)]
    return [(n0, min(cols, block + rows - n0, n_out - n0))
            for block in range(0, n_out, rows)
            for n0 in range(block, min(block + rows, n_out), cols)]


def emit_tiles(emitter, spec, folded: np.ndarray, target, lut: int
               ) -> "tuple[int, int, int, int, int] | None":
    """Emit the tiles of a layer on the default mapping with ``emitter`` (a
    :class:`~hwonnx.compiler.emitter.TileEmitter`): M tiles of output pixels, N tiles of
    output channels (:func:`n_tiles`), for each the K tiles of its non-zero weight blocks;
    returns their nest ``(M, N, K1, K2, K3)`` when every N tile has the same K tiles in
    kernel-row, column (or source), block order (:mod:`.depthwise` streams the others)."""
    cfg = emitter.config
    rows, cols = cfg.rows, cfg.cols
    n_out, kh, kw = spec.phys.shape[:3]
    oh, ow = spec.out_hw
    sy, sx = spec.strides
    dy, dx = spec.dilations
    pt, pl = spec.pads[0], spec.pads[1]
    tiles_n = n_tiles(n_out, rows, cols, spec.pool_max)
    par_addr = emitter.params(spec, folded, tiles_n)
    k_tiles, tile_addr = emitter.weight_tiles(spec, tiles_n)
    first_of_layer = True
    # M tiles of whole output rows where a row fits half the accumulators, so that
    # every tile starts at column 0 (a nest steps its rows by a constant)
    m_total = oh * ow
    m_tile = min(m_total, cfg.acc_half if ow > cfg.acc_half else ow * tile_rows(
        oh, ow, [len(k_tiles[n0]) for n0, _ in tiles_n], tiles_n, cfg))
    if spec.scatter is not None and 1 < ow <= cfg.acc_half:
        m_tile = ow        # a scattered row is one POST: one per tile keeps the nest
    if emitter.dry:
        return nest(k_tiles, -(-m_total // m_tile), len(tiles_n))

    def k_tile(n0: int, k_index: int, index: int, ky: int, kx: int, cb: int) -> tuple:
        """A K tile's MATMUL with the fields that no M tile changes (each M tile's is a
        copy of it with the others: :meth:`~.micro._Record.moved`, without the keyword
        checks of ``MatMul.of`` on millions of tiles), its ``ixr``, its source, the row
        of its first input pixel less the M tile's first output row times the stride,
        and its channel block. Without padding no read is outside its source, and every
        tile has the first source's ``zp`` (so that the sources of an Add form one
        nest)."""
        src, ixr = spec.sources[index], kx * dx - pl
        template = MatMul.of(
            first=int(k_index == 0), wgt_addr=tile_addr[n0, index, ky, kx, cb], ow=ow,
            ih=src.ih, iw=src.iw, ixr=ixr, sy=sy, sx=sx, step_x=sx * src.cb,
            step_y=sy * src.iw * src.cb,
            zp=spec.padding(src if any(spec.pads) else spec.sources[0]),
            pool_max=int(spec.pool_max), wpack=emitter.wpack)
        return template, ixr, src, ky * dy - pt, cb

    k_fields = {n0: [k_tile(n0, k_index, *k) for k_index, k in enumerate(k_tiles[n0])]
                for n0, _ in tiles_n}
    for m0 in range(0, m_total, m_tile):
        mt = min(m_tile, m_total - m0)
        oy0, ox0 = divmod(m0, ow)
        for n_index, (n0, nt) in enumerate(tiles_n):
            acc_base = emitter.output_tile()
            posts = emitter.posts(spec, target, acc_base, (m0, mt), (n0, nt), par_addr,
                                  n_index, lut)
            last = len(k_fields[n0]) - 1
            for k_index, (template, ixr, src, iy_off, cb) in enumerate(k_fields[n0]):
                iy0, ix0 = oy0 * sy + iy_off, ox0 * sx + ixr
                matmul = template.moved(
                    wait=int(first_of_layer), count=mt, acc_addr=acc_base,
                    act_addr=src.base + (iy0 * src.iw + ix0) * src.cb + cb,
                    act_row=src.base + (iy0 * src.iw + ixr) * src.cb + cb,
                    ox0=ox0, iy0=iy0, ix0=ix0)
                first_of_layer = False
                emitter.add_tile(matmul, posts if k_index == last else [])   # POSTs last
    return nest(k_tiles, -(-m_total // m_tile), len(tiles_n))
