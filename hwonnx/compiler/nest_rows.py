"""A layer's micro-instructions as one integer matrix, a row per instruction and a column per
field of :data:`hwonnx.isa.FIELDS` (0 where unset: :func:`~.loops.normalized`, row by row),
for :func:`~.loops.compress`'s check that a nest issues what its tiles say, made on whole
columns instead of instruction by instruction (ResNet-18 with an external memory: 1,413
nests, 1.79 M instructions).

:func:`schedule_rows` is :func:`~.loops.schedule` of the tiles, :func:`expand_rows`
:func:`~.loops.expand` of a SETMM, SETPOST and LOOP: the walker's rules in closed form, each
field of the tile ``t = (m, n, k1, k2, k3)`` from the counts of the steps before it
(``tests/compiler/test_loops.py`` compares both with their instruction-by-instruction forms).
"""

from operator import itemgetter

import numpy as np

from ..hdl.loader import tile_words
from ..isa import FIELDS, Op
from .micro import MatMul, layout

__all__ = ["schedule_rows", "expand_rows", "rows_in_range", "COLUMN"]

#: The column of each instruction field in a row of :func:`expand_rows` (``compiler/timing.py``
#: reads the ones it times).
COLUMN = {f.name: k for k, f in enumerate(FIELDS)}
_LOW = np.array([f.min for f in FIELDS], dtype=np.int64)
_HIGH = np.array([f.max for f in FIELDS], dtype=np.int64)
_IN_ORDER = itemgetter(*COLUMN)
_MATMUL_NAMES = layout(MatMul)[0]
_MATMUL_GET = itemgetter(*_MATMUL_NAMES)
_MATMUL_COLUMNS = [COLUMN[name] for name in _MATMUL_NAMES]


def rows_in_range(rows: np.ndarray) -> bool:
    """Whether every field of ``rows`` fits its width (:data:`~hwonnx.isa.FIELDS`)."""
    return not len(rows) or bool((rows.min(axis=0) >= _LOW).all()
                                 and (rows.max(axis=0) <= _HIGH).all())


def _normalized(instrs: "list[dict]") -> np.ndarray:
    """:func:`~.loops.normalized` of each of ``instrs``, as rows."""
    unset = dict.fromkeys(COLUMN, 0)
    return np.array([_IN_ORDER({**unset, **i}) for i in instrs], dtype=np.int64).reshape(
        len(instrs), len(FIELDS))


def _interleaved(matmuls: np.ndarray, loads: np.ndarray, posts: np.ndarray,
                 post_counts: np.ndarray) -> np.ndarray:
    """The rows in the order of a layer's schedule: the loads of tiles 0 and 1, then per
    tile ``t`` its MATMUL, the load of tile ``t + 1`` when ``1 <= t < count - 1``, and its
    ``post_counts[t]`` POSTs (``loads``: one per tile, ``posts`` in tile order)."""
    count = len(matmuls)
    head = min(count, 2)
    between = np.zeros(count, dtype=np.int64)
    between[1:count - 1] = 1
    sizes = 1 + between + post_counts
    starts = head + np.concatenate(([0], np.cumsum(sizes)[:-1]))
    out = np.empty((head + int(sizes.sum()), len(FIELDS)), dtype=np.int64)
    out[:head] = loads[:head]
    out[starts] = matmuls
    later = np.flatnonzero(between)
    out[starts[later] + 1] = loads[later + 1]
    if len(posts):
        tile_of = np.repeat(np.arange(count), post_counts)
        within = np.arange(len(posts)) - np.repeat(np.cumsum(post_counts) - post_counts,
                                                   post_counts)
        out[starts[tile_of] + 1 + between[tile_of] + within] = posts
    return out


def _loads(banks: np.ndarray, wgt: np.ndarray, wpack: np.ndarray) -> np.ndarray:
    loads = np.zeros((len(banks), len(FIELDS)), dtype=np.int64)
    loads[:, COLUMN["op"]] = Op.LOADW
    loads[:, COLUMN["bank"]] = banks
    loads[:, COLUMN["wgt_addr"]] = wgt
    loads[:, COLUMN["wpack"]] = wpack
    return loads


def schedule_rows(tiles: list, bank: int) -> np.ndarray:
    """The rows of ``schedule(tiles, bank)``: every field of each of its records, 0 where
    unset (None). The MATMULs' fields are read as floats, which turn None into NaN (exact:
    a field that fits its width is far below 2**53; :func:`rows_in_range` refuses the
    rest)."""
    count = len(tiles)
    values = np.array([_MATMUL_GET(tile.matmul.__dict__) for tile in tiles],
                      dtype=np.float64).reshape(count, len(_MATMUL_NAMES))
    np.nan_to_num(values, copy=False, nan=0.0)
    matmuls = np.zeros((count, len(FIELDS)), dtype=np.int64)
    matmuls[:, _MATMUL_COLUMNS] = values
    banks = (bank + np.arange(count)) % 2
    matmuls[:, COLUMN["bank"]] = banks
    loads = _loads(banks, matmuls[:, COLUMN["wgt_addr"]], matmuls[:, COLUMN["wpack"]])
    posts = _normalized([post.fields() for tile in tiles for post in tile.posts])
    return _interleaved(matmuls, loads, posts,
                        np.array([len(tile.posts) for tile in tiles], dtype=np.int64))


def expand_rows(setmm: dict, setpost: dict, loop: dict, config) -> np.ndarray:
    """The rows of ``expand(setmm, setpost, loop, config)``."""
    half, wpack, rows = config.acc_half, setmm["wpack"], config.rows
    words = tile_words(config, wpack)
    M, N = loop["m_count"], loop["n_count"]
    K1, K2, K3 = loop["k1"], loop["k2"], loop["k3"]
    if min(M, N, K1, K2, K3) < 1:
        raise ValueError(f"A LOOP needs at least one tile per level, not {M, N, K1, K2, K3}")
    K = K1 * K2 * K3
    m, n, k1, k2, k3 = (axis.ravel() for axis in np.indices((M, N, K1, K2, K3),
                                                             dtype=np.int64))
    t = np.arange(M * N * K, dtype=np.int64)
    k = (k1 * K2 + k2) * K3 + k3
    tile = m * N + n                                  # the output tile
    k3_steps, k2_steps = (k1 * K2 + k2) * (K3 - 1) + k3, k1 * (K2 - 1) + k2
    matmuls = np.tile(np.array(_normalized([setmm])[0]), (len(t), 1))
    column = {name: matmuls[:, index] for name, index in COLUMN.items()}
    column["op"][:] = Op.MATMUL
    column["bank"][:] = loop["bank"] ^ (t & 1)
    column["wait"][:] = t == 0
    column["first"][:] = k == 0
    column["count"][:] = np.where(m == M - 1, loop["count_last"], setmm["count"])
    wgt = setmm["wgt_addr"] + (n * K + k) * words
    column["wgt_addr"][:] = wgt
    column["acc_addr"][:] = (loop["acc"] ^ (tile & 1)) * half
    act = (setmm["act_addr"] + m * loop["act_m"] + n * loop["act_n"]
           + k3_steps * loop["act_k3"] + k2_steps * loop["act_k2"] + k1 * loop["act_k1"])
    column["act_addr"][:] = column["act_row"][:] = act
    column["iy0"][:] = setmm["iy0"] + m * loop["iy_m"] + k1 * loop["iy_k1"]
    column["ix0"][:] = column["ixr"][:] = (setmm["ix0"] + k2_steps * loop["ix_k2"]
                                           + k1 * loop["ix_k1"])
    # the POST side: each N tile's lane and output word, the walker's carries in order
    lanes, words_n, lane, out = [], [], setpost["lane_off"], 0
    for j in range(N):
        lanes.append(lane)
        words_n.append(out)
        if j < N - 1:
            lane += loop["lane_n"]
            carry = int(lane >= rows)
            lane -= carry * rows
            out += loop["word_n"] + carry
    pm, pn = (axis.ravel() for axis in np.indices((M, N), dtype=np.int64))
    posts = np.tile(np.array(_normalized([setpost])[0]), (M * N, 1))
    post = {name: posts[:, index] for name, index in COLUMN.items()}
    lane_of = np.array(lanes, dtype=np.int64)[pn]
    nt = np.where(pn == N - 1, loop["nt_last"], setpost["nt"])
    post["op"][:] = Op.POST
    post["acc_addr"][:] = (loop["acc"] ^ ((pm * N + pn) & 1)) * half
    post["count"][:] = np.where(pm == M - 1, loop["post_count_last"], setpost["count"])
    post["par_addr"][:] = setpost["par_addr"] + pn * loop["par_n"]
    post["out_addr"][:] = (setpost["out_addr"] + pm * loop["out_m"]
                           + np.array(words_n, dtype=np.int64)[pn])
    post["lane_off"][:] = lane_of
    post["nt"][:] = nt
    post["nw"][:] = (lane_of + nt - 1) // rows + 1
    banks = loop["bank"] ^ (t & 1)
    loads = _loads(banks, wgt, np.full(len(t), wpack, dtype=np.int64))
    if len(t) > 1:
        loads[1, COLUMN["wgt_addr"]] = loop["w1"]
    return _interleaved(matmuls, loads, posts, (k == K - 1).astype(np.int64))
