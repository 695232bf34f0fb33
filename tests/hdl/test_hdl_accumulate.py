"""The accumulator buffer's read-modify-write (hdl/accumulate.py), driven as the feeder drives
it (read acc_read_latency cycles before the write: 2 in the compact datapath, 3 through the
block RAM's output register in the pipelined one, where the sum then waits a cycle in a
register before the block RAM writes it; never two writes in consecutive cycles to the same
word): random streams of writes to a few words, back to back, two and more cycles
apart to the same word, adding, keeping the larger or overwriting (``first``), with element-wise
engine writes in the gaps, leave every word as a Python model of the same writes in order
says (int32 wrap-around); the post-processor's port reads each word two cycles after its
address."""

import dataclasses

import numpy as np
import pytest

from hwonnx.hdl.accumulate import Accumulators, acc_write_latency
from hwonnx.hdl.bram import REGISTERED_READ_LATENCY
from hwonnx.hdl.feeder import acc_read_latency

from hdl_helpers import run_cycles, small_config


def _wrap(value: int) -> int:
    return (value + (1 << 31)) % (1 << 32) - (1 << 31)


@pytest.mark.parametrize("mul_stages", [1, 5], ids=["compact", "pipelined"])
@pytest.mark.parametrize("seed", range(4))
def test_read_modify_write_equals_the_writes_in_order(seed, mul_stages):
    config = dataclasses.replace(small_config(2, 3), mul_stages=mul_stages)
    latency, post_latency = acc_read_latency(config), REGISTERED_READ_LATENCY
    write_latency = acc_write_latency(config)
    rng = np.random.default_rng(seed)
    words = 4                         # few words: the same word often one or two cycles apart
    cycles = 600
    # per cycle: None (quiet), ("rmw", addr, first, max, sums) or ("ew", addr, data)
    plan = []
    for cycle in range(cycles):
        kind = rng.choice(["rmw", "rmw", "rmw", "ew", None])
        addr = int(rng.integers(0, words))
        value = [int(v) for v in rng.integers(-(1 << 31), 1 << 31, config.cols)]
        if kind == "rmw":
            plan.append(("rmw", addr, int(rng.random() < 0.1), int(rng.random() < 0.3), value))
        elif kind == "ew":
            plan.append(("ew", addr, value))
        else:
            plan.append(None)
    dut = Accumulators(config)
    reads = {}

    def step(ctx, cycle):
        ahead = plan[cycle + latency] if cycle + latency < cycles else None
        ctx.set(dut.raddr, ahead[1] if ahead and ahead[0] == "rmw" else 0)
        now = plan[cycle] if cycle < cycles else None
        rmw, ew = bool(now and now[0] == "rmw"), bool(now and now[0] == "ew")
        full = (1 << config.cols) - 1            # the selects: a bit per column, all equal
        ctx.set(dut.we, rmw)
        ctx.set(dut.ew_we, full * ew)
        if rmw:
            _, addr, first, largest, sums = now
            ctx.set(dut.waddr, addr)
            ctx.set(dut.first, full * first)
            ctx.set(dut.max, full * largest)
            for c, v in enumerate(sums):
                ctx.set(dut.sums[c], v)
        if ew:
            ctx.set(dut.ew_addr, now[1])
            for c, v in enumerate(now[2]):
                ctx.set(dut.ew_data[c], v)
        if cycle >= cycles + 2:                      # read every word back
            word = cycle - cycles - 2
            ctx.set(dut.post_addr, min(word, words - 1))
            if word >= post_latency:
                reads[word - post_latency] = [ctx.get(dut.post_data[c])
                                              for c in range(config.cols)]

    # the words start as what the first writes of each make them: begin with a `first`
    # write to every word
    for addr in range(words):
        plan.insert(0, ("rmw", addr, 1, 0, [0] * config.cols))
    plan.insert(0, None)
    # the feeder never writes a word in the cycle after it wrote it (hdl/feeder.py: collide)
    for cycle in range(1, len(plan)):
        now, before = plan[cycle], plan[cycle - 1]
        if now and before and now[0] == before[0] == "rmw" and now[1] == before[1]:
            plan[cycle] = None
    # the element-wise engine never writes while the feeder's reads are in flight or its
    # last sum waits for the block RAM (the engine starts once the feeder is drained)
    for cycle, now in enumerate(plan):
        if now and now[0] == "ew" and any(
                other and other[0] == "rmw"
                for other in plan[max(cycle - write_latency, 0):cycle + 1 + latency]):
            plan[cycle] = None
    cycles = len(plan)
    run_cycles(dut, cycles + 2 + words + post_latency, step)

    model = {}
    for item in plan:
        if item is None:
            continue
        if item[0] == "ew":
            model[item[1]] = list(item[2])
            continue
        _, addr, first, largest, sums = item
        old = model.get(addr, [0] * config.cols)
        if first:
            model[addr] = list(sums)
        elif largest:
            model[addr] = [max(o, s) for o, s in zip(old, sums)]
        else:
            model[addr] = [_wrap(o + s) for o, s in zip(old, sums)]
    assert reads == {addr: model[addr] for addr in range(words)}
    # the streams hold writes to one word two, three and four cycles apart (never one): every
    # case of forwarding
    same = [(i, j) for i in range(len(plan)) for j in (1, 2, 3, 4) if i + j < len(plan)
            and plan[i] and plan[i + j] and plan[i][0] == plan[i + j][0] == "rmw"
            and plan[i][1] == plan[i + j][1]]
    assert {j for _, j in same} == {2, 3, 4} and len(same) > 50
