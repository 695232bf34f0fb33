"""Instruction order of a layer, and its compact looped form.

A layer is a list of tiles in nest order, each a MATMUL (without its weight bank) and the
POSTs that follow its last K tile. :func:`schedule` lists the micro-instructions the engines
receive for it: the weight loads run one tile ahead of the array (the loads of tiles 0 and 1
first, then the load of tile ``t + 1`` right after MATMUL ``t``, while the other bank is in
use), and a tile's POSTs follow that load.

:func:`compress` finds the three instructions (SETMM, SETPOST, LOOP) from which the tile
walker regenerates exactly that list, and :func:`expand` is the walker's reference model:
``hdl/walker.py`` implements the same rules, register for register. ``compress`` accepts a
looped form only if its expansion equals the explicit list, so a layer whose tiles are not a
regular nest simply stays explicit.
"""

from dataclasses import dataclass

import numpy as np

from ..config import ArchConfig
from ..hdl.loader import tile_words
from ..isa import FIELDS, LOOP_FIELDS, Op
from .micro import LoadW, MatMul, Post
from .nest_rows import expand_rows, rows_in_range, schedule_rows

__all__ = ["Tile", "LayerTiles", "schedule", "compress", "expand", "normalized",
           "post_counts"]


@dataclass
class Tile:
    """One tile: its MATMUL (without ``bank``) and the POSTs after it."""
    matmul: MatMul
    posts: "list[Post]"


@dataclass
class LayerTiles:
    """The tiles of one layer and their nest ``(M, N, K1, K2, K3)`` when they form one; or,
    for a layer that does not run on the array (the element-wise engine), no tiles and its
    micro-instructions as they are stored (``records``: :mod:`.micro` records)."""
    tiles: "list[Tile]"
    nest: "tuple[int, int, int, int, int] | None" = None
    records: "list | None" = None


def normalized(instr: dict) -> dict:
    """Every field of a micro-instruction, 0 where unset (metadata keys dropped)."""
    return {f.name: int(instr.get(f.name, 0)) for f in FIELDS}


def schedule(tiles: "list[Tile]", bank: int) -> "list[LoadW | MatMul | Post]":
    """The micro-instructions of a layer whose first tile uses weight bank ``bank``."""
    out = []

    def load(i):
        matmul = tiles[i].matmul
        out.append(LoadW((bank + i) % 2, matmul.wgt_addr,
                         0 if matmul.wpack is None else matmul.wpack))

    count = len(tiles)
    load(0)
    if count > 1:
        load(1)
    for i, tile in enumerate(tiles):
        out.append(tile.matmul.moved(bank=(bank + i) % 2))
        if 1 <= i < count - 1:
            load(i + 1)
        out.extend(tile.posts)
    return out


def expand(setmm: dict, setpost: dict, loop: dict, config: ArchConfig) -> "list[dict]":
    """The micro-instructions the tile walker issues for ``SETMM``, ``SETPOST``, ``LOOP``."""
    half, wpack = config.acc_half, setmm["wpack"]
    words, rows = tile_words(config, wpack), config.rows
    M, N = loop["m_count"], loop["n_count"]
    K1, K2, K3 = loop["k1"], loop["k2"], loop["k3"]
    if min(M, N, K1, K2, K3) < 1:
        raise ValueError(f"A LOOP needs at least one tile per level, not {M, N, K1, K2, K3}")
    out = []
    # MATMUL side: the tile being issued.
    m = n = k1 = k2 = k3 = 0
    first_tile, bank, acc = True, loop["bank"], loop["acc"]
    wgt, act, iy, ix = setmm["wgt_addr"], setmm["act_addr"], setmm["iy0"], setmm["ix0"]
    act_mn = act_m = act
    iy_m = iy
    # POST side: the output tile whose POST comes next.
    pm = pn = 0
    p_acc, par, out_m, lane = loop["acc"], setpost["par_addr"], setpost["out_addr"], \
        setpost["lane_off"]
    out_addr = out_m

    out.append(dict(op=Op.LOADW, bank=bank, wgt_addr=wgt, wpack=wpack))
    if M * N * K1 * K2 * K3 > 1:
        out.append(dict(op=Op.LOADW, bank=bank ^ 1, wgt_addr=loop["w1"], wpack=wpack))
    while True:
        last_k = k1 == K1 - 1 and k2 == K2 - 1 and k3 == K3 - 1
        last_tile = last_k and n == N - 1 and m == M - 1
        out.append({**setmm, "op": Op.MATMUL, "bank": bank, "wait": int(first_tile),
                    "first": int(k1 == k2 == k3 == 0),
                    "count": loop["count_last"] if m == M - 1 else setmm["count"],
                    "wgt_addr": wgt, "acc_addr": acc * half, "act_addr": act, "act_row": act,
                    "iy0": iy, "ix0": ix, "ixr": ix})
        was_first = first_tile
        first_tile, bank = False, bank ^ 1
        if not last_k:
            wgt += words
            if k3 < K3 - 1:
                k3, act = k3 + 1, act + loop["act_k3"]
            elif k2 < K2 - 1:
                k3, k2, act, ix = 0, k2 + 1, act + loop["act_k2"], ix + loop["ix_k2"]
            else:
                k3, k2, k1 = 0, 0, k1 + 1
                act, iy, ix = act + loop["act_k1"], iy + loop["iy_k1"], ix + loop["ix_k1"]
        else:
            k1 = k2 = k3 = 0
            acc ^= 1
            ix = setmm["ix0"]
            if n < N - 1:
                n, wgt = n + 1, wgt + words
                act_mn += loop["act_n"]
                act, iy = act_mn, iy_m
            else:
                n, m, wgt = 0, m + 1, setmm["wgt_addr"]
                act_m += loop["act_m"]
                iy_m += loop["iy_m"]
                act_mn = act = act_m
                iy = iy_m
        if not was_first and not last_tile:
            out.append(dict(op=Op.LOADW, bank=bank, wgt_addr=wgt, wpack=wpack))
        if last_k:
            last_n = pn == N - 1
            nt = loop["nt_last"] if last_n else setpost["nt"]
            out.append({**setpost, "op": Op.POST, "acc_addr": p_acc * half,
                        "count": loop["post_count_last"] if pm == M - 1 else setpost["count"],
                        "par_addr": par, "out_addr": out_addr, "lane_off": lane, "nt": nt,
                        "nw": (lane + nt - 1) // rows + 1})
            p_acc ^= 1
            if not last_n:
                pn, par = pn + 1, par + loop["par_n"]
                lane += loop["lane_n"]
                carry = int(lane >= rows)
                lane -= carry * rows
                out_addr += loop["word_n"] + carry
            else:
                pn, pm, par, lane = 0, pm + 1, setpost["par_addr"], setpost["lane_off"]
                out_m += loop["out_m"]
                out_addr = out_m
        if last_tile:
            return out


def post_counts(setpost: dict, loop: dict) -> "set[int]":
    """The ``count`` fields of the POSTs that :func:`expand` issues for ``SETPOST``, ``LOOP``:
    the last M tile's, and the others' when there are several."""
    return {loop["post_count_last"]} | ({setpost["count"]} if loop["m_count"] > 1 else set())


def compress(layer: LayerTiles, bank: int, config: ArchConfig
             ) -> "tuple[dict, dict, dict] | None":
    """``(SETMM, SETPOST, LOOP)`` of a layer whose tiles form its nest, or None when the
    walker cannot regenerate them: checked by expanding the result, every field of every
    micro-instruction against the explicit schedule (both as rows of a matrix,
    :mod:`.nest_rows`)."""
    tiles = layer.tiles
    if layer.nest is None or not tiles:
        return None
    M, N, K1, K2, K3 = layer.nest
    K = K1 * K2 * K3
    if len(tiles) != M * N * K or any(len(t.posts) != (1 if (i + 1) % K == 0 else 0)
                                      for i, t in enumerate(tiles)):
        return None

    def mm(m, n, k):
        return normalized(tiles[(m * N + n) * K + k].matmul.fields())

    def post(m, n):
        return normalized(tiles[(m * N + n) * K + K - 1].posts[0].fields())

    def step(key, a, b):
        return a[key] - b[key]

    setmm = {**mm(0, 0, 0), "op": Op.SETMM, "bank": 0}
    setpost = {**post(0, 0), "op": Op.SETPOST}
    p0 = post(0, 0)
    loop = {f.name: 0 for f in LOOP_FIELDS}
    loop.update(op=Op.LOOP, bank=bank, acc=int(setmm["acc_addr"] == config.acc_half),
                m_count=M, n_count=N, k1=K1, k2=K2, k3=K3,
                w1=tiles[1].matmul.wgt_addr if len(tiles) > 1 else 0,
                count_last=mm(M - 1, 0, 0)["count"], post_count_last=post(M - 1, 0)["count"],
                nt_last=post(0, N - 1)["nt"])
    if K3 > 1:
        loop["act_k3"] = step("act_addr", mm(0, 0, 1), mm(0, 0, 0))
    if K2 > 1:
        a, b = mm(0, 0, K3), mm(0, 0, K3 - 1)
        loop.update(act_k2=step("act_addr", a, b), ix_k2=step("ix0", a, b))
    if K1 > 1:
        a, b = mm(0, 0, K2 * K3), mm(0, 0, K2 * K3 - 1)
        loop.update(act_k1=step("act_addr", a, b), iy_k1=step("iy0", a, b),
                    ix_k1=step("ix0", a, b))
    if N > 1:
        p1 = post(0, 1)
        lane_n = (p1["lane_off"] - p0["lane_off"]) % config.rows
        carry = int(p0["lane_off"] + lane_n >= config.rows)
        loop.update(act_n=step("act_addr", mm(0, 1, 0), mm(0, 0, 0)),
                    par_n=step("par_addr", p1, p0), lane_n=lane_n,
                    word_n=step("out_addr", p1, p0) - carry)
    if M > 1:
        a = mm(1, 0, 0)
        loop.update(act_m=step("act_addr", a, mm(0, 0, 0)), iy_m=step("iy0", a, mm(0, 0, 0)),
                    out_m=step("out_addr", post(1, 0), p0))
    if any(not f.min <= loop[f.name] <= f.max for f in LOOP_FIELDS):
        return None
    expected = schedule_rows(tiles, bank)
    if not rows_in_range(expected):
        return None        # stays explicit, where encoding names the field that overflows
    if not np.array_equal(expand_rows(setmm, setpost, loop, config), expected):
        return None
    return setmm, setpost, loop

