"""WeightLoader: a LOADW dispatched in cycle t reads weight word ``wgt_addr + (r >> wpack)``
in cycle t+1+r and writes row r, unpacked, into array row r of its bank in cycle
t+1+write_delay+r: t+4+r (the address presented to the banked buffer in t+r, a cycle ahead,
the word on its read port in t+3+r, in a register in t+4+r), compact t+3+r (a plain memory,
the address in t+1+r); ``busy`` is high for exactly ``rows`` cycles
(t+1 .. t+rows), so the next LOADW can be dispatched in t+1+rows; ``free_next`` is high
exactly when ``busy`` is low in the next cycle (without a LOADW taken in this one)."""

import dataclasses

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module, signed
from amaranth.lib import data, wiring

from hwonnx.isa import Op
from hwonnx.hdl import SystolicArray, array_latency
from hwonnx.compiler.weights import layer_wpack, pack_tile, unpack_tile
from hwonnx.hdl.banks import BANKED_READ_LATENCY, BankedMemory
from hwonnx.hdl.loader import (WEIGHT_PACKINGS, WeightLoader, address_lead, tile_words,
                               write_delay)

from hdl_helpers import SyncReadMemory, run_cycles, set_instr, small_config, words

GEOMETRIES = [(1, 1), (2, 3), (3, 2), (4, 4)]


def loadw(bank, wgt_addr, wpack=0):
    return dict(op=Op.LOADW, bank=bank, wgt_addr=wgt_addr, wpack=wpack)


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("wpack", WEIGHT_PACKINGS)
@pytest.mark.parametrize("rows, cols", GEOMETRIES + [(5, 2)])
def test_loader_writes_row_r_write_delay_after_its_read(rows, cols, wpack, compact):
    """Whatever the packing: the timing of 8-bit weights, from ``ceil(rows / 2**wpack)``
    words per tile, row ``r`` from word ``r >> wpack``; the buffer's read latency 2 (in
    banks) or 1 (compact)."""
    config = dataclasses.replace(small_config(rows, cols), mul_stages=1 if compact else 5)
    assert write_delay(config) == (3 - compact)
    rng = np.random.default_rng(rows * 10 + cols + 100 * wpack)
    per, half = 1 << wpack, 1 << (7 >> wpack)         # 8, 4 or 2 bits: -half .. half - 1
    count = tile_words(config, wpack)
    assert count == -(-rows // per)
    tiles = [rng.integers(-half, half, (rows, cols)) for _ in range(3)]
    tiles[0][0, 0], tiles[1][-1, -1] = -half, half - 1       # both ends of the range
    addresses = [int(rng.integers(count, config.wgt_depth - 2 * count + 1)),   # apart
                 config.wgt_depth - count, 0]
    image = [0] * config.wgt_depth
    for tile, address in zip(tiles, addresses):
        image[address:address + count] = pack_tile(tile, wpack)
    dut = WeightLoader(config)
    # The buffer's read port: the banked buffer's latency from the address (which the loader
    # presents a cycle early), the single memory's.
    lead = address_lead(config)
    assert lead == (0 if compact else 1)
    latency = 1 if compact else BANKED_READ_LATENCY
    assert write_delay(config) - 1 + lead == latency
    memory = SyncReadMemory(image, dut.wgt.addr, dut.wgt.data.as_value(), en=dut.wgt.en,
                            latency=latency)
    # Back to back, as the cycle model schedules them (loader_free = t + rows + 1), both
    # banks, including a tile that ends at the last weight word.
    t0 = 2
    instrs = {t0 + i * (rows + 1): loadw(bank, address, wpack)
              for i, (bank, address) in enumerate(zip((1, 0, 1), addresses))}
    writes, busy = {}, set()
    for (t, instr), tile in zip(instrs.items(), tiles):
        busy.update(range(t + 1, t + 1 + rows))
        for r in range(rows):
            writes[t + 1 + write_delay(config) + r] = (r, instr["bank"], list(tile[r]))
    cycles = max(writes) + 3
    seen = {}

    def step(ctx, cycle):
        instr = instrs.get(cycle)
        ctx.set(dut.instr.valid, instr is not None)
        if instr is not None:
            assert not ctx.get(dut.busy), f"dispatch in cycle {cycle} while busy"
            set_instr(ctx, dut.instr, instr)
        assert ctx.get(dut.busy) == (cycle in busy), f"busy in cycle {cycle}"
        assert ctx.get(dut.free_next) == (cycle in instrs or cycle + 1 not in busy), \
            f"free_next in cycle {cycle}"
        assert ctx.get(dut.wgt.en) == (cycle + lead in busy), f"wgt.en in cycle {cycle}"
        if ctx.get(dut.wload_en):
            seen[cycle] = (ctx.get(dut.wload_row), ctx.get(dut.wload_bank),
                           list(ctx.get(dut.wload_data)))

    run_cycles(dut, cycles, step, memories=(memory,))
    assert seen == writes
    assert memory.reads == [(t + 1 + r - lead, instr["wgt_addr"] + (r >> wpack))
                            for t, instr in instrs.items() for r in range(rows)]


def test_packed_words_hold_rows_from_the_least_significant_bits():
    """The layout the loader reads, written out by hand on 3 rows x 2 columns."""
    config = small_config(3, 2)
    tile = np.array([[1, -2], [-1, 0], [0, 1]])
    # 4-bit: word 0 lane 0 = rows 0, 1 = 0x1, 0xF -> 0xF1; lane 1 = 0xE, 0x0 -> 0x0E; word 1
    # holds row 2 alone
    assert pack_tile(tile, 1) == [0x0EF1, 0x0100]
    # 2-bit: one word; lane 0 = 01, 11, 00 -> 0b00_11_01; lane 1 = 10, 00, 01 -> 0b01_00_10
    assert pack_tile(tile, 2) == [0b010010 << 8 | 0b001101]
    assert pack_tile(tile, 0) == [0xFE01, 0x00FF, 0x0100]
    for wpack in WEIGHT_PACKINGS:
        np.testing.assert_array_equal(unpack_tile(pack_tile(tile, wpack), wpack, config), tile)
    assert [layer_wpack(np.array(v)) for v in ([-128, 127], [-8, 7], [-9], [8], [-2, 1],
                                                [-1, 1], [2], [0])] == [0, 1, 0, 0, 2, 2, 1, 2]


class LoaderAndArray(Elaboratable):
    """The weight buffer, loader and array wired as in ``hdl/top.py``."""

    def __init__(self, config, wgt):
        self.config, self.wgt = config, wgt
        self.loader = WeightLoader(config)
        self.array = SystolicArray(config)

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        m.submodules.loader = loader = self.loader
        m.submodules.array = array = self.array
        m.submodules.wgt = wgt = BankedMemory(data.ArrayLayout(signed(8), cfg.cols),
                                              cfg.wgt_depth, self.wgt)
        wiring.connect(m, loader.wgt, wgt.read)
        m.d.comb += [array.wload_en.eq(loader.wload_en), array.wload_row.eq(loader.wload_row),
                     array.wload_bank.eq(loader.wload_bank),
                     array.wload_data.eq(loader.wload_data)]
        return m


@pytest.mark.parametrize("rows, cols", GEOMETRIES)
def test_loaded_tiles_multiply_in_the_array(rows, cols):
    """Two LOADWs back to back into banks 0 and 1 of the banked weight buffer; words for a
    bank are fed from the cycle its row 0 is written (t+1+write_delay, t+4), the earliest the
    row skew allows, alternating banks once both are loaded. (A MATMUL dispatched in the
    cycle after the LOADW feeds its first word in t+2+feed_delay, t+5: dispatch t+1, start
    t+2, read t+3, the word in registers in t+4 and t+5.)"""
    config = small_config(rows, cols)
    rng = np.random.default_rng(50 + rows * 10 + cols)
    wgt = rng.integers(-128, 128, (config.wgt_depth, cols))
    dut = LoaderAndArray(config, words(wgt))
    t0, t1 = 1, 2 + rows
    instrs = {t0: loadw(0, 3), t1: loadw(1, config.wgt_depth - rows)}
    tiles = [wgt[3:3 + rows], wgt[config.wgt_depth - rows:]]
    first = 1 + write_delay(config)
    feeds = {t0 + first + i: 0 for i in range(t1 - t0)}
    feeds.update({t1 + first + i: (i + 1) % 2 for i in range(2 * rows + 6)})
    acts = {cycle: rng.integers(-128, 128, rows) for cycle in feeds}
    latency = array_latency(config)
    sums = {}

    def step(ctx, cycle):
        loader, array = dut.loader, dut.array
        instr = instrs.get(cycle)
        ctx.set(loader.instr.valid, instr is not None)
        if instr is not None:
            set_instr(ctx, loader.instr, instr)
        ctx.set(array.feed_bank, feeds.get(cycle, 0))
        ctx.set(array.feed, [int(a) for a in acts.get(cycle, np.zeros(rows, np.int64))])
        sums[cycle] = list(ctx.get(array.sums))

    run_cycles(dut, max(feeds) + latency + 1, step)
    for cycle, bank in feeds.items():
        np.testing.assert_array_equal(sums[cycle + latency], acts[cycle] @ tiles[bank],
                                      err_msg=f"word fed in cycle {cycle}, bank {bank}")
