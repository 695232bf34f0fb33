"""Instruction fetch (``hdl/fetch.py``) over a model of its program memory's read port.

WideFetch: the instructions leave in program order with ``decoded`` as the ISA decodes each, the
first ``fetch_latency`` cycles after ``start`` (the cycle model's ``fetched()``); taken every
cycle, one per cycle; under random stalls, an instruction is on offer in every cycle after
the first (the queue never runs dry); ``start`` empties the queue and starts over from
instruction 0; paged (``prog_page``), a page's first instruction is read in the first cycle
after the page before was taken that ``fresh`` is high, on offer ``fetch_latency`` later.

NarrowFetch: each instruction is assembled from ``fetch_words`` program words, least
significant first; the first is valid ``fetch_words + 2`` cycles after ``start``, the next
``fetch_words + 1`` cycles after the one before is taken (no prefetch), the words read in
order. The testbench raises ``ready`` (``fire``) only in cycles an instruction is on offer,
as the dispatcher in ``hdl/top.py`` does, and ``running`` from the cycle after ``start``;
one test raises ``ready`` without ``valid`` (nothing is taken: the stream rule).
"""

import dataclasses

import numpy as np
import pytest

from hwonnx.hdl.bram import buffer_read_latency
from hwonnx.hdl.fetch import NarrowFetch, WideFetch, fetch_latency
from hwonnx.isa import Op, encode, fields_of

from hdl_helpers import SyncReadMemory, decoded_value, run_cycles, small_config

START = 1


def random_program(rng, count):
    """``count`` instruction words of random ops, every field of each op's layout random."""
    program = []
    for _ in range(count):
        op = int(rng.choice(list(Op)))
        fields = {f.name: int(rng.integers(f.min, f.max + 1)) for f in fields_of(op)}
        program.append(encode(**{**fields, "op": op}))
    return program


def simulate_wide(config, contents, cycles, ready, fresh=lambda cycle: True, starts=(START,)):
    """Returns the instructions offered (``{cycle: word}``) and taken (``[(cycle, word)]``)."""
    dut = WideFetch(config)
    memory = SyncReadMemory(contents, dut.prog.addr, dut.prog.data.as_value(), en=dut.prog.en,
                            latency=buffer_read_latency(config))
    offered, taken = {}, []

    def step(ctx, cycle):
        start = cycle in starts
        ctx.set(dut.start, start)
        ctx.set(dut.running, cycle > starts[0])
        ctx.set(dut.fresh, fresh(cycle))
        valid = ctx.get(dut.instr.valid)
        take = bool(valid and not start and ready(cycle))
        ctx.set(dut.instr.ready, take)
        if valid:
            word = ctx.get(dut.instr.payload.as_value())
            assert ctx.get(dut.decoded.as_value()) == decoded_value(word), \
                f"decoded in cycle {cycle}"
            offered[cycle] = word
            if take:
                taken.append((cycle, word))

    run_cycles(dut, cycles, step, memories=(memory,))
    return offered, taken


#: The compact datapath's program memory reads in one cycle, the others' through the block
#: RAM's output register in two (``buffer_read_latency``).
DATAPATHS = pytest.mark.parametrize("mul_stages", [1, 5], ids=["compact", "pipelined"])


def wide_config(mul_stages, **changes):
    return dataclasses.replace(small_config(2, 2),
                               **{"prog_depth": 64, "mul_stages": mul_stages, **changes})


def test_fetch_latency_by_hand():
    """The read, the block RAM's output register (not in the compact datapath), the capture."""
    assert fetch_latency(wide_config(1)) == 2 and fetch_latency(wide_config(5)) == 3


@DATAPATHS
def test_wide_one_per_cycle_from_fetch_latency(mul_stages):
    config = wide_config(mul_stages)
    program = random_program(np.random.default_rng(1), 64)
    offered, taken = simulate_wide(config, program, 60, lambda cycle: True)
    first = START + fetch_latency(config)
    assert min(offered) == first
    assert taken == [(first + i, program[i]) for i in range(60 - first)]


@DATAPATHS
@pytest.mark.parametrize("p_ready", [0.2, 0.5, 0.8])
def test_wide_in_order_under_random_stalls(p_ready, mul_stages):
    config = wide_config(mul_stages)
    rng = np.random.default_rng(int(p_ready * 10))
    program = random_program(rng, 64)
    stalls = rng.random(200) < p_ready
    offered, taken = simulate_wide(config, program, 200, lambda cycle: stalls[cycle])
    assert [word for _, word in taken] == [program[i % 64] for i in range(len(taken))]
    assert len(taken) > 20      # (the read pointer wraps at the end of the memory)
    # on offer in every cycle from the first, whatever the dispatcher did before
    assert sorted(offered) == list(range(START + fetch_latency(config), 200))


@DATAPATHS
def test_wide_start_starts_over_from_instruction_0(mul_stages):
    config = wide_config(mul_stages)
    program = random_program(np.random.default_rng(2), 64)
    restart = 20
    offered, taken = simulate_wide(config, program, 40, lambda cycle: cycle % 3 != 0,
                                   starts=(START, restart))
    before = [word for cycle, word in taken if cycle < restart]
    after = [(cycle, word) for cycle, word in taken if cycle > restart]
    assert before == program[:len(before)] and len(before) > 5
    assert restart + 1 not in offered and min(c for c in offered if c > restart) == \
        restart + fetch_latency(config)
    assert [word for _, word in after] == program[:len(after)]


@DATAPATHS
def test_wide_ready_without_valid_takes_nothing(mul_stages):
    """The stream rule (``layouts.instr_stream``): a cycle with ``ready`` and not ``valid``
    (here ``running`` low for three cycles) takes nothing."""
    config = wide_config(mul_stages)
    program = random_program(np.random.default_rng(4), 64)
    dut = WideFetch(config)
    memory = SyncReadMemory(program, dut.prog.addr, dut.prog.data.as_value(), en=dut.prog.en,
                            latency=buffer_read_latency(config))
    taken = []

    def step(ctx, cycle):
        ctx.set(dut.start, cycle == START)
        ctx.set(dut.running, cycle > START and cycle not in (6, 7, 8))
        ctx.set(dut.fresh, 1)
        ctx.set(dut.instr.ready, 1)
        if ctx.get(dut.instr.valid):
            taken.append(ctx.get(dut.instr.payload.as_value()))

    run_cycles(dut, 16, step, memories=(memory,))
    assert taken == program[:len(taken)]


@DATAPATHS
@pytest.mark.parametrize("page", [2, 4])
def test_wide_paged_waits_for_each_page(page, mul_stages):
    """``prog_depth = 2 * page``; ``fresh`` low for some cycles around the page ends. Within a
    page, one instruction per cycle; the page's first is read in the first cycle after
    ``start`` or after the page before was taken with ``fresh`` high."""
    config = wide_config(mul_stages, prog_depth=2 * page, prog_page=page, ext_memory="ulx3s-sdram",
                         ext_depth=1024)
    program = random_program(np.random.default_rng(page), 2 * page)
    stale = set(range(2, 6)) | set(range(14, 17)) | set(range(30, 32))
    offered, taken = simulate_wide(config, program, 60, lambda cycle: True,
                                   fresh=lambda cycle: cycle not in stale)
    assert [word for _, word in taken] == [program[i % (2 * page)] for i in range(len(taken))]
    cycle = START + 1
    for i, (when, _) in enumerate(taken):
        if i % page == 0:
            while cycle in stale:
                cycle += 1
            assert when == cycle + fetch_latency(config), f"instruction {i}"
        else:
            assert when == taken[i - 1][0] + 1, f"instruction {i}"
        cycle = when + 1
    assert len(taken) >= 4 * page


def narrow_config(width):
    return dataclasses.replace(small_config(2, 2), prog_width=width)


def simulate_narrow(config, program, cycles, ready, starts=(START,)):
    words, width = config.fetch_words, config.prog_width
    memory_words = [(word >> (i * width)) & ((1 << width) - 1)
                    for word in program for i in range(words)]
    dut = NarrowFetch(config)
    memory = SyncReadMemory(memory_words, dut.mem_addr, dut.mem_data, en=dut.mem_en)
    offered, taken = {}, []

    def step(ctx, cycle):
        start = cycle in starts
        ctx.set(dut.start, start)
        ctx.set(dut.running, cycle > starts[0])
        valid = ctx.get(dut.valid)
        take = bool(valid and not start and ready(cycle))
        ctx.set(dut.fire, take)
        if valid:
            word = ctx.get(dut.instr.as_value())
            assert ctx.get(dut.decoded.as_value()) == decoded_value(word), \
                f"decoded in cycle {cycle}"
            offered[cycle] = word
            if take:
                taken.append((cycle, word))

    run_cycles(dut, cycles, step, memories=(memory,))
    return offered, taken, memory.reads


@pytest.mark.parametrize("width", [8, 96, 416])
@pytest.mark.parametrize("p_ready", [1.0, 0.4])
def test_narrow_assembles_whole_instructions(width, p_ready):
    config = narrow_config(width)
    words = config.fetch_words
    rng = np.random.default_rng(width)
    program = random_program(rng, config.prog_depth)
    stalls = rng.random(1000) < p_ready
    cycles = min(1000, (config.prog_depth - 1) * (words + 1) + START + 2)
    offered, taken, reads = simulate_narrow(config, program, cycles, lambda c: stalls[c])
    assert [word for _, word in taken] == program[:len(taken)] and len(taken) >= 3
    # the first valid fetch_words + 2 cycles after start, each next fetch_words + 1 after the
    # one before was taken, then on offer until taken
    ready_at = START + words + 2
    for when, _ in taken:
        assert min(c for c in offered if c >= ready_at) == ready_at
        assert all(c in offered for c in range(ready_at, when + 1))
        ready_at = when + words + 1
    assert not [c for c in offered if c > taken[-1][0] and c < ready_at]
    # the words read in order, at most those of the instruction after the last taken
    assert [address for _, address in reads] == list(range(len(reads)))
    assert len(reads) <= (len(taken) + 1) * words


def test_narrow_start_discards_what_is_in_flight():
    config = narrow_config(96)
    words = config.fetch_words
    program = random_program(np.random.default_rng(3), config.prog_depth)
    restart = START + words + 5       # instruction 0 taken at once, instruction 1 half read
    offered, taken, _ = simulate_narrow(config, program, restart + 3 * (words + 1) + 2,
                                        lambda c: True, starts=(START, restart))
    assert taken[0] == (START + words + 2, program[0])
    again = [(c, w) for c, w in taken if c > restart]
    assert again[0] == (restart + words + 2, program[0])
    assert [w for _, w in again] == program[:len(again)] and len(again) >= 2
