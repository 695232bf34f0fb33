"""WeightLoader: a LOADW dispatched in cycle t reads weight word ``wgt_addr + r`` in cycle
t+1+r and writes it into array row r of its bank in cycle t+2+r; ``busy`` is high for exactly
``rows`` cycles (t+1 .. t+rows), so the next LOADW can be dispatched in t+1+rows."""

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module, signed
from amaranth.lib import data
from amaranth.lib.memory import Memory

from hwonnx.isa import Op
from hwonnx.hdl import SystolicArray, array_latency
from hwonnx.hdl.loader import WeightLoader

from hdl_helpers import SyncReadMemory, run_cycles, set_instr, small_config, words

GEOMETRIES = [(1, 1), (2, 3), (3, 2), (4, 4)]


def loadw(bank, wgt_addr):
    return dict(op=Op.LOADW, bank=bank, wgt_addr=wgt_addr)


@pytest.mark.parametrize("rows, cols", GEOMETRIES)
def test_loader_writes_row_r_in_cycle_t_plus_2_plus_r(rows, cols):
    config = small_config(rows, cols)
    rng = np.random.default_rng(rows * 10 + cols)
    wgt = rng.integers(-128, 128, (config.wgt_depth, cols))
    dut = WeightLoader(config)
    memory = SyncReadMemory(words(wgt), dut.wgt_addr, en=dut.wgt_en)
    # Back to back, as the cycle model schedules them (loader_free = t + rows + 1), both
    # banks, including a tile that ends at the last weight word.
    t0 = 2
    instrs = {t0: loadw(1, int(rng.integers(0, config.wgt_depth - rows + 1))),
              t0 + rows + 1: loadw(0, config.wgt_depth - rows),
              t0 + 2 * rows + 2: loadw(1, 0)}
    writes, busy = {}, set()
    for t, instr in instrs.items():
        busy.update(range(t + 1, t + 1 + rows))
        for r in range(rows):
            writes[t + 2 + r] = (r, instr["bank"], list(wgt[instr["wgt_addr"] + r]))
    cycles = max(writes) + 3
    seen = {}

    def step(ctx, cycle):
        instr = instrs.get(cycle)
        ctx.set(dut.dispatch, instr is not None)
        if instr is not None:
            assert not ctx.get(dut.busy), f"dispatch in cycle {cycle} while busy"
            set_instr(ctx, dut.instr, instr)
        assert ctx.get(dut.busy) == (cycle in busy), f"busy in cycle {cycle}"
        assert ctx.get(dut.wgt_en) == (cycle in busy), f"wgt_en in cycle {cycle}"
        if ctx.get(dut.wload_en):
            seen[cycle] = (ctx.get(dut.wload_row), ctx.get(dut.wload_bank), memory.current)

    run_cycles(dut, cycles, step, memories=(memory,))
    assert seen == writes
    assert memory.reads == [(t + 1 + r, instr["wgt_addr"] + r)
                            for t, instr in instrs.items() for r in range(rows)]


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
        m.submodules.wgt = wgt = Memory(shape=data.ArrayLayout(signed(8), cfg.cols),
                                        depth=cfg.wgt_depth, init=self.wgt)
        port = wgt.read_port()
        m.d.comb += [port.addr.eq(loader.wgt_addr), port.en.eq(loader.wgt_en),
                     array.wload_en.eq(loader.wload_en), array.wload_row.eq(loader.wload_row),
                     array.wload_bank.eq(loader.wload_bank), array.wload_data.eq(port.data)]
        return m


@pytest.mark.parametrize("rows, cols", GEOMETRIES)
def test_loaded_tiles_multiply_in_the_array(rows, cols):
    """Two LOADWs back to back into banks 0 and 1; words for a bank are fed from the cycle
    its row 0 is written (t+2), the earliest the row skew allows, alternating banks once
    both are loaded."""
    config = small_config(rows, cols)
    rng = np.random.default_rng(50 + rows * 10 + cols)
    wgt = rng.integers(-128, 128, (config.wgt_depth, cols))
    dut = LoaderAndArray(config, words(wgt))
    t0, t1 = 1, 2 + rows
    instrs = {t0: loadw(0, 3), t1: loadw(1, config.wgt_depth - rows)}
    tiles = [wgt[3:3 + rows], wgt[config.wgt_depth - rows:]]
    feeds = {t0 + 2 + i: 0 for i in range(t1 - t0)}
    feeds.update({t1 + 2 + i: (i + 1) % 2 for i in range(2 * rows + 6)})
    acts = {cycle: rng.integers(-128, 128, rows) for cycle in feeds}
    latency = array_latency(config)
    sums = {}

    def step(ctx, cycle):
        loader, array = dut.loader, dut.array
        instr = instrs.get(cycle)
        ctx.set(loader.dispatch, instr is not None)
        if instr is not None:
            set_instr(ctx, loader.instr, instr)
        ctx.set(array.feed_bank, feeds.get(cycle, 0))
        ctx.set(array.feed, [int(a) for a in acts.get(cycle, np.zeros(rows, np.int64))])
        sums[cycle] = list(ctx.get(array.sums))

    run_cycles(dut, max(feeds) + latency + 1, step)
    for cycle, bank in feeds.items():
        np.testing.assert_array_equal(sums[cycle + latency], acts[cycle] @ tiles[bank],
                                      err_msg=f"word fed in cycle {cycle}, bank {bank}")
