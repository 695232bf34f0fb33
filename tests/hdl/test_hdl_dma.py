"""DmaEngine over the ExternalMemory model (hdl/dma.py, hdl/extmem.py): LOADX copies
``count`` words from external word ``ext_addr`` to weight word ``wgt_addr``, each in the cycle
it arrives, and the engine is idle again in exactly the cycle MemoryTimeline predicts, through
bursts, the read latency and refreshes that fall due before, between and during transfers;
LOADA and STOREA move activation words in and out the same way, reads and writes sharing the
memory's timeline, one of them waiting in the engine's slot while the one before runs; a
LOADX's parameter words follow its weights into the parameter buffer."""

from dataclasses import replace

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module
from amaranth.lib import wiring

from hwonnx.hdl.dma import DmaEngine
from hwonnx.hdl.extmem import ExternalMemory, MemoryTimeline
from hwonnx.memories import ULX3S_SDRAM, ExtTiming
from hwonnx.isa import EXT_WORDS_PER_PARAM, Op

from hdl_helpers import SyncReadMemory, run_cycles, set_instr, small_config

EXT_DEPTH = 96


class _Pair(Elaboratable):
    def __init__(self, config, timing):
        self.dma = DmaEngine(config, timing)
        self.mem = ExternalMemory(EXT_DEPTH, config.cols * 8, timing)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dma, m.submodules.mem = self.dma, self.mem
        dma, mem = self.dma, self.mem
        wiring.connect(m, dma.ext, mem.port)
        return m


def _load_then_restart(ctx, mem, cycle: int, image: list, restart: int) -> None:
    """Load ``image`` into the memory model one word a cycle from cycle 0, then pulse
    ``restart`` in cycle ``restart`` (cycle 0 of the timeline)."""
    loading = cycle < EXT_DEPTH
    ctx.set(mem.load_we, loading)
    if loading:
        ctx.set(mem.load_addr, cycle)
        ctx.set(mem.load_data, image[cycle])
    ctx.set(mem.restart, cycle == restart)


#: With 3-byte words: one cycle a word, three (a byte-wide bus), two (the ULX3S's 16 bits).
TIMINGS = {
    "refresh_often": ExtTiming(latency=3, burst=4, refresh_period=23, refresh_cycles=3,
                               bus_bytes=3),
    "single_words": ExtTiming(latency=2, burst=1, refresh_period=9, refresh_cycles=2,
                              bus_bytes=1),
    "ulx3s_sdram": ULX3S_SDRAM,
}


@pytest.mark.parametrize("name", TIMINGS)
def test_loadx_copies_the_words_in_the_predicted_cycles(name):
    timing = TIMINGS[name]
    config = small_config(2, 3)                    # 24-bit weight words, 32 of them
    rng = np.random.default_rng(len(name))
    image = [int(w) for w in rng.integers(0, 1 << 24, EXT_DEPTH)]
    counts = [min(c, config.wgt_depth) for c in (0, 1, timing.burst, timing.burst + 1,
                                                  2 * timing.burst + 3, 32, 17, 5, 29, 1)]
    transfers = []
    for count in counts:
        ext = int(rng.integers(0, EXT_DEPTH - count + 1))
        wgt = int(rng.integers(0, config.wgt_depth - count + 1))
        transfers.append((count, ext, wgt, int(rng.integers(0, 2 * timing.refresh_period))))
    pair = _Pair(config, timing)
    dma, mem = pair.dma, pair.mem
    restart = EXT_DEPTH + 1           # the image is loaded first; cycle 0 of the timeline
    state = {"next": 0, "earliest": restart + 3, "dispatched": []}
    writes, idle = [], {}

    def step(ctx, cycle):
        _load_then_restart(ctx, mem, cycle, image, restart)
        idle[cycle] = ctx.get(dma.idle)
        if ctx.get(dma.wgt_we):
            writes.append((cycle, ctx.get(dma.wgt_addr), ctx.get(dma.wgt_data)))
        go = (state["next"] < len(transfers) and cycle >= state["earliest"] and idle[cycle])
        ctx.set(dma.instr.valid, go)
        if go:
            count, ext, wgt, gap = transfers[state["next"]]
            set_instr(ctx, dma.instr, dict(op=Op.LOADX, count=count, ext_addr=ext,
                                           wgt_addr=wgt))
            state["dispatched"].append(cycle)
            state["next"] += 1
            state["earliest"] = cycle + 1 + gap

    run_cycles(pair, restart + 2500, step)
    assert state["next"] == len(transfers)

    timeline = MemoryTimeline(timing, config.cols)
    expected_writes = []
    for (count, ext, wgt, _), dispatch in zip(transfers, state["dispatched"]):
        last = restart + timeline.read(dispatch - restart + 1, count)
        # busy from the cycle after the dispatch through the last word, idle after it
        assert [idle[c] for c in range(dispatch + 1, last + 2)] == [0] * (last - dispatch) + [1]
        expected_writes += [(wgt + i, image[ext + i]) for i in range(count)]
        cycles = [c for c, _, _ in writes if dispatch < c <= last]
        assert cycles[-1:] == ([last] if count else [])
        # a word every `beats` cycles within a burst, and a latency more between bursts
        gaps, beats = [b - a for a, b in zip(cycles, cycles[1:])], timing.beats(config.cols)
        bursts = -(-count // timing.burst)
        assert all(gap >= beats for gap in gaps) and gaps.count(beats) == count - bursts
    assert [(a, d) for _, a, d in writes] == expected_writes
    # the transfers spanned several refreshes
    assert state["dispatched"][-1] - restart > 4 * timing.refresh_period


@pytest.mark.parametrize("name", TIMINGS)
def test_activation_transfers_in_the_predicted_cycles(name):
    """Random LOADA, STOREA and LOADX: a LOADX dispatched when the engine is idle, a LOADA or
    STOREA when its slot is free (with ``fence``, idle), so most wait in the slot behind the
    one before. Every word lands where it should (a STOREA's words read back by a later
    LOADA); each transfer starts in the cycle it is dispatched or, waiting, in the cycle the
    one before is done, and ends when MemoryTimeline says; ``idle`` and ``slot_free``
    follow."""
    timing = TIMINGS[name]
    config = small_config(3, 3)                    # 24-bit activation and external words
    rng = np.random.default_rng(7 + len(name))
    image = [int(w) for w in rng.integers(0, 1 << 24, EXT_DEPTH)]
    act = [int(w) for w in rng.integers(0, 1 << 24, config.act_depth)]
    ops = [Op.STOREA, Op.LOADA, Op.LOADX, Op.STOREA, Op.STOREA, Op.LOADA, Op.LOADA,
           Op.STOREA, Op.LOADX, Op.LOADA, Op.STOREA, Op.LOADA, Op.STOREA, Op.LOADA]
    transfers = []
    for op in ops:
        local = config.wgt_depth if op == Op.LOADX else config.act_depth
        count = int(rng.integers(0, min(local, max(2 * timing.burst + 3, 12)) + 1))
        transfers.append((op, count, int(rng.integers(0, EXT_DEPTH - count + 1)),
                          int(rng.integers(0, local - count + 1)),
                          int(rng.integers(0, 8)), int(rng.integers(0, 4) == 0)))
    pair = _Pair(config, timing)
    dma, mem = pair.dma, pair.mem
    reader = SyncReadMemory(act, dma.act_raddr, dma.act_rdata, dma.act_ren)
    restart = EXT_DEPTH + 1
    state = {"next": 0, "earliest": restart + 3, "dispatched": []}
    idle, slot_free, loaded, stored = {}, {}, [], []

    def step(ctx, cycle):
        _load_then_restart(ctx, mem, cycle, image, restart)
        idle[cycle], slot_free[cycle] = ctx.get(dma.idle), ctx.get(dma.slot_free)
        if ctx.get(dma.act_we):                  # the activation buffer takes the word
            address, word = ctx.get(dma.act_waddr), ctx.get(dma.act_wdata)
            reader.contents[address] = word
            loaded.append((cycle, address, word))
        if ctx.get(dma.ext.wr_valid) and ctx.get(dma.ext.wr_ready):
            stored.append((cycle, ctx.get(dma.ext.wr_addr), ctx.get(dma.ext.wr_data)))
        go = state["next"] < len(transfers) and cycle >= state["earliest"]
        if go:
            op, count, ext, local, gap, fence = transfers[state["next"]]
            go = idle[cycle] if op == Op.LOADX or fence else slot_free[cycle]
        ctx.set(dma.instr.valid, go)
        if go:
            fields = {"wgt_addr": local} if op == Op.LOADX else {"act_addr": local,
                                                                 "fence": fence}
            set_instr(ctx, dma.instr, {"op": op, "count": count, "ext_addr": ext, **fields})
            state["dispatched"].append(cycle)
            state["next"] += 1
            state["earliest"] = cycle + 1 + gap

    run_cycles(pair, restart + 3000, step, memories=[reader])
    assert state["next"] == len(transfers)

    timeline = MemoryTimeline(timing, config.cols)
    ext_words, act_words = list(image), list(act)
    expect_loaded, expect_stored = [], []
    free, waited = 0, 0             # the cycle the engine is free; transfers that waited
    busy, held = set(), set()       # cycles not idle; cycles the slot holds one
    for (op, count, ext, local, _, _), dispatch in zip(transfers, state["dispatched"]):
        begin = max(dispatch, free)
        waited += begin > dispatch
        held.update(range(dispatch + 1, begin + 1))
        if op == Op.STOREA:
            last = restart + timeline.write(begin - restart + 2, count)
            for i in range(count):
                expect_stored.append((ext + i, act_words[local + i]))
                ext_words[ext + i] = act_words[local + i]
        else:
            last = restart + timeline.read(begin - restart + 1, count)
            if op == Op.LOADA:
                for i in range(count):
                    expect_loaded.append((local + i, ext_words[ext + i]))
                    act_words[local + i] = ext_words[ext + i]
        busy.update(range(dispatch + 1, last + 1))
        free = last + 1
        if op == Op.STOREA and count:
            assert max(c for c, _, _ in stored if c <= last) == last
        if op == Op.LOADA and count:
            assert max(c for c, _, _ in loaded if c <= last) == last
    span = range(restart, free + 2)
    assert [c for c in span if not idle[c]] == sorted(busy)
    assert [c for c in span if not slot_free[c]] == sorted(held)
    assert [(a, w) for _, a, w in loaded] == expect_loaded
    assert [(a, w) for _, a, w in stored] == expect_stored
    assert len(expect_stored) >= 10 and len(expect_loaded) >= 10 and waited >= 3


def test_a_restart_during_a_refresh_starts_the_timeline_over():
    """``restart`` in any cycle of the refresh schedule, a refresh under way included (one
    that fell due while the host wrote the next sample's input): a LOADX dispatched in the
    next cycles ends when MemoryTimeline predicts from the restart, as every run of a
    program must take the same cycles."""
    # refreshes longer than the cycles from a restart to a LOADX's first read command;
    # restarts over a whole refresh period
    timing = ExtTiming(latency=3, burst=4, refresh_period=23, refresh_cycles=8, bus_bytes=3)
    config = small_config(2, 3)
    image = [int(w) for w in np.random.default_rng(3).integers(0, 1 << 24, EXT_DEPTH)]
    for restart in range(EXT_DEPTH + 1, EXT_DEPTH + 1 + timing.refresh_period):
        for delay in (1, 2):
            pair = _Pair(config, timing)
            dma, mem = pair.dma, pair.mem
            idle = {}

            def step(ctx, cycle):
                _load_then_restart(ctx, mem, cycle, image, restart)
                idle[cycle] = ctx.get(dma.idle)
                go = cycle == restart + delay
                ctx.set(dma.instr.valid, go)
                if go:
                    set_instr(ctx, dma.instr, dict(op=Op.LOADX, count=2 * timing.burst + 1,
                                                   ext_addr=5, wgt_addr=0))

            run_cycles(pair, restart + 80, step)
            last = restart + MemoryTimeline(timing, config.cols).read(
                delay + 1, 2 * timing.burst + 1)
            busy = [c for c in range(restart, restart + 80) if not idle[c]]
            assert busy == list(range(restart + delay + 1, last + 1)), (restart, delay)


def test_timing_needs_a_refresh_period_longer_than_a_read():
    with pytest.raises(ValueError, match="refresh period"):
        ExtTiming(latency=8, burst=16, refresh_period=20, refresh_cycles=4)


@pytest.mark.parametrize("name", TIMINGS)
def test_loadx_parameters_follow_the_weights_in_the_predicted_cycles(name):
    """A LOADX with ``par_count`` words of parameters reads them after its weights, as a read
    dispatched in the cycle the engine is free again, and writes each parameter word (its
    EXT_WORDS_PER_PARAM words, least significant first) in the cycle its last word arrives;
    the engine is idle after that, as MemoryTimeline predicts."""
    timing = TIMINGS[name]
    config = replace(small_config(2, 3), par_depth=8)
    per, width = EXT_WORDS_PER_PARAM, config.cols * 8
    rng = np.random.default_rng(7 + len(name))
    image = [int(w) for w in rng.integers(0, 1 << width, EXT_DEPTH)]
    transfers = []                   # (weight words, ext, wgt, parameter words, ext, par)
    for count, params in ((5, 1), (0, 2), (timing.burst + 1, 0), (1, 3), (17, 8), (0, 0)):
        transfers.append((count, int(rng.integers(0, EXT_DEPTH - count + 1)),
                          int(rng.integers(0, config.wgt_depth - count + 1)), params,
                          int(rng.integers(0, EXT_DEPTH - params * per + 1)),
                          int(rng.integers(0, config.par_depth - params + 1))))
    pair = _Pair(config, timing)
    dma, mem = pair.dma, pair.mem
    restart = EXT_DEPTH + 1
    state = {"next": 0, "earliest": restart + 3, "dispatched": []}
    wgt_writes, par_writes, idle = [], [], {}

    def step(ctx, cycle):
        _load_then_restart(ctx, mem, cycle, image, restart)
        idle[cycle] = ctx.get(dma.idle)
        if ctx.get(dma.wgt_we):
            wgt_writes.append((cycle, ctx.get(dma.wgt_addr), ctx.get(dma.wgt_data)))
        if ctx.get(dma.par_we):
            par_writes.append((cycle, ctx.get(dma.par_addr), ctx.get(dma.par_data)))
        go = state["next"] < len(transfers) and cycle >= state["earliest"] and idle[cycle]
        ctx.set(dma.instr.valid, go)
        if go:
            count, ext, wgt, params, par_ext, par = transfers[state["next"]]
            set_instr(ctx, dma.instr, dict(op=Op.LOADX, count=count, ext_addr=ext,
                                           wgt_addr=wgt, par_count=params * per,
                                           par_ext=par_ext, par_addr=par))
            state["dispatched"].append(cycle)
            state["next"] += 1
            state["earliest"] = cycle + 1 + int(rng.integers(0, 9))

    run_cycles(pair, restart + 2500, step)
    assert state["next"] == len(transfers)

    timeline = MemoryTimeline(timing, config.cols)
    expected_wgt, expected_par = [], []
    for (count, ext, wgt, params, par_ext, par), dispatch in zip(transfers,
                                                                state["dispatched"]):
        weights_in = timeline.read(dispatch - restart + 1, count)
        last = restart + (timeline.read(weights_in + 2, params * per) if params else weights_in)
        assert [idle[c] for c in range(dispatch + 1, last + 2)] == [0] * (last - dispatch) + [1]
        expected_wgt += [(wgt + i, image[ext + i]) for i in range(count)]
        words = [image[par_ext + i] for i in range(params * per)]
        expected_par += [(par + j, sum(w << (width * i)
                                       for i, w in enumerate(words[j * per:(j + 1) * per])))
                         for j in range(params)]
        if params:                   # the last parameter word is written as its last arrives
            assert [c for c, _, _ in par_writes if dispatch < c <= last][-1] == last
    assert [(a, d) for _, a, d in wgt_writes] == expected_wgt
    assert [(a, d) for _, a, d in par_writes] == expected_par
