"""ProgramRAM (``hdl/program_ram.py``), the single-port program memory of a narrow-fetch
accelerator: a random sequence of writes, reads, idle cycles and writes with ``re`` also high,
against a dictionary: ``we`` writes ``data`` at ``addr``; otherwise ``re`` reads ``addr`` and
``rdata`` shows the word in the next cycle and holds it until the next read (a write never
reads, and the memory starts at 0). On an iCE40 UltraPlus it is ``width / 16`` SPRAM blocks,
and a geometry they cannot hold is refused."""

import gc
import warnings

import numpy as np
import pytest
from amaranth.back import rtlil
from amaranth.hdl import UnusedElaboratable

from hwonnx.hdl.program_ram import SPRAM_DEPTH, SPRAM_WIDTH, ProgramRAM

from hdl_helpers import run_cycles


@pytest.mark.parametrize("depth, width", [(16, 8), (37, 96), (8, 416)])
def test_write_then_read_one_port(depth, width):
    rng = np.random.default_rng(depth * width)
    dut = ProgramRAM(depth, width)
    memory = {}
    expected = [0]          # rdata: 0 before any read
    ops = rng.choice(["write", "read", "idle", "write+re"], 400, p=[0.35, 0.4, 0.1, 0.15])
    reads = []

    def step(ctx, cycle):
        op = ops[cycle]
        address = int(rng.integers(depth))
        value = _random_word(rng, width)
        ctx.set(dut.addr, address)
        ctx.set(dut.data, value)
        ctx.set(dut.we, op.startswith("write"))
        ctx.set(dut.re, op in ("read", "write+re"))
        assert ctx.get(dut.rdata) == expected[0], f"cycle {cycle}"
        if op == "read":
            expected[0] = memory.get(address, 0)
            reads.append(address in memory)
        elif op.startswith("write"):
            memory[address] = value

    run_cycles(dut, len(ops), step)
    assert sum(reads) > 50          # most reads find a word written before


def _random_word(rng, width):
    return sum(int(rng.integers(1 << 16)) << (16 * i) for i in range(-(-width // 16))) \
        & ((1 << width) - 1)


class _UltraPlus:
    device = "iCE40UP5K"


@pytest.mark.parametrize("width", [16, 64])
def test_ice40_ultraplus_uses_spram_blocks(width):
    text = rtlil.convert(ProgramRAM(1024, width), platform=_UltraPlus())
    assert text.count("cell \\SB_SPRAM256KA") == width // SPRAM_WIDTH


@pytest.mark.parametrize("depth, width", [(SPRAM_DEPTH + 1, 16), (1024, 24)])
def test_ice40_ultraplus_refuses_what_spram_cannot_hold(depth, width):
    with warnings.catch_warnings():     # (the module elaborate began is left unused)
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match="SPRAM program memory"):
            ProgramRAM(depth, width).elaborate(_UltraPlus())
        gc.collect()
