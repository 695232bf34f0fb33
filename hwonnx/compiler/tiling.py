"""How :mod:`.lower` cuts a layer into tiles: the output channels into N tiles, the output
rows into M tiles, the nest a LOOP walks, and the POSTs of an output tile."""

import numpy as np

from ..config import ArchConfig
from ..hdl.feeder import drain_cycles

__all__ = ["n_tiles", "nest", "post_runs", "tile_rows"]


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
