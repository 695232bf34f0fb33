"""EltwiseEngine: bit-exact accumulators against ``hwonnx.golden.ops.eltwise_acc`` in every
mode (sum, product, maximum, minimum) with extreme weights and zero points, the read
addresses and their cycles (A then B, strides, the broadcast ``b_stride = 0``), the write
cycles and the ``idle`` timing the cycle model relies on (``eltwise_cycles``), behind an
activation buffer read in one cycle (the compact datapath) and in two (the block RAMs' output
registers)."""

from dataclasses import replace

import numpy as np
import pytest

from hwonnx.golden.ops import eltwise_acc
from hwonnx.hdl.eltwise import EltwiseEngine, eltwise_cycles
from hwonnx.isa import ELTW_MODES, Op

from hdl_helpers import SyncReadMemory, run_cycles, set_instr, small_config

K_MAX = (1 << 17) - 1


def _instrs(rng, depth):
    """Back-to-back ELTWs: each mode, extreme and random weights and zero points."""
    out = []
    for mode, mul, ka, kb in (("sum", 0, K_MAX, -(1 << 17)), ("sum", 1, 0, 0),
                              ("max", 0, 65536, 22004), ("min", 0, -(1 << 17), K_MAX),
                              ("sum", 0, int(rng.integers(-K_MAX, K_MAX)),
                               int(rng.integers(-K_MAX, K_MAX))), ("sum", 1, 5, 0)):
        count = int(rng.integers(1, 6))
        out.append(dict(op=Op.ELTW, mode=ELTW_MODES[mode], mul=mul, ka=ka, kb=kb,
                        za=int(rng.choice([-128, 127, rng.integers(-128, 128)])),
                        zb=int(rng.choice([-128, 127, rng.integers(-128, 128)])),
                        count=count, acc_addr=int(rng.integers(0, 16 - count)),
                        a_addr=int(rng.integers(0, depth // 2)), a_stride=int(rng.integers(1, 3)),
                        b_addr=int(rng.integers(0, depth // 2)), b_stride=int(rng.integers(0, 3))))
    return out


@pytest.mark.parametrize("rows, cols, latency", [(4, 4, 2), (3, 5, 2), (1, 1, 2), (4, 4, 1)])
def test_engine_matches_golden_and_the_cycle_rule(rows, cols, latency):
    cfg = small_config(rows, cols)
    if latency == 1:                            # the compact datapath's plain memory
        cfg = replace(cfg, mul_stages=1)
    rng = np.random.default_rng(rows * 10 + cols)
    act = rng.integers(-128, 128, (cfg.act_depth, rows))
    act[0], act[1] = -128, 127                  # extreme operands
    instrs = _instrs(rng, cfg.act_depth)
    dut = EltwiseEngine(cfg)
    memory = SyncReadMemory([[int(v) for v in word] for word in act], dut.act_addr,
                            dut.act_data, en=dut.act_en, latency=latency)
    # dispatch each in the cycle the engine is predicted idle again
    dispatch, t = [], 1
    for instr in instrs:
        dispatch.append(t)
        t += eltwise_cycles(cfg, instr["count"])
    expected_reads, expected_writes = [], {}
    for t0, instr in zip(dispatch, instrs):
        mode = {v: k for k, v in ELTW_MODES.items()}[instr["mode"]]
        for i in range(instr["count"]):
            a = act[instr["a_addr"] + i * instr["a_stride"]]
            b = act[instr["b_addr"] + i * instr["b_stride"]]
            expected_reads += [(t0 + 1 + 2 * i, instr["a_addr"] + i * instr["a_stride"]),
                               (t0 + 2 + 2 * i, instr["b_addr"] + i * instr["b_stride"])]
            acc = eltwise_acc(a, b, mode=mode, mul=bool(instr["mul"]), ka=instr["ka"],
                              kb=instr["kb"], za=instr["za"], zb=instr["zb"])
            lanes = [int(v) for v in acc[:min(rows, cols)]] + [0] * max(cols - rows, 0)
            # B read in t0 + 2 + 2i: its data (``latency`` cycles), the data in a register,
            # zero points, the products' operands, the products, the products in logic,
            # combination, write
            expected_writes[t0 + 2 + 2 * i + latency + 6] = (instr["acc_addr"] + i, lanes)
    writes, idle = {}, []

    def step(ctx, cycle):
        ctx.set(dut.instr.valid, 0)
        if cycle in dispatch:
            set_instr(ctx, dut.instr, instrs[dispatch.index(cycle)])
            ctx.set(dut.instr.valid, 1)
        idle.append(ctx.get(dut.idle))
        we = ctx.get(dut.acc_we)                 # a bit per column, all equal
        assert we in (0, (1 << cols) - 1), (cycle, we)
        if we:
            writes[cycle] = (ctx.get(dut.acc_addr),
                             [int(v) for v in ctx.get(dut.acc_data)])

    run_cycles(dut, t + 3, step, [memory])
    assert writes == expected_writes
    assert memory.reads == expected_reads
    busy = {c for t0, i in zip(dispatch, instrs) for c in range(t0 + 1, t0 +
                                                                  eltwise_cycles(cfg, i["count"]))}
    assert [c for c, v in enumerate(idle) if not v] == sorted(busy)
