"""``hwonnx build --clock``: the ECP5 PLL's setting for a clock (every one within the
EHXPLLL's limits, the fastest of at most the target, checked against a search written here
from the data sheet's formula), the board build written at that clock (the PLL cell's
dividers, the clock constraint, the folder's record read back by
``hwonnx bitstream``), and the refusals."""

import json
import re

import pytest

from hwonnx.boards import at_clock, get_board
from hwonnx.boards.build import folder_board
from hwonnx.boards.clocks import ecp5_pll, pll_clock
from hwonnx.cli import main
from hwonnx.errors import UsageError
from hwonnx.examples import example_path, load_digits_data

OSC = 25_000_000


def fastest_by_formula(source, target):
    """Every (CLKI_DIV, CLKFB_DIV, CLKOP_DIV) of the data sheet's ranges, with the phase
    detector in 3.125-400 MHz, the VCO (output x CLKOP_DIV) in 400-800 MHz and the output in
    3.125-400 MHz: the fastest whole-hertz output of at most ``target``."""
    outputs = [source * fb / clki for clki in range(1, 129) for fb in range(1, 81)
               if 3.125e6 <= source / clki <= 400e6 and source * fb % clki == 0]
    return max((f for f in outputs if 3.125e6 <= f <= min(target, 400e6)
                and any(400e6 <= f * op <= 800e6 for op in range(1, 129))), default=None)


@pytest.mark.parametrize("mhz", [3.2, 12, 24, 25, 48, 50, 60, 75, 90, 92, 93.7, 99.9, 100,
                                 131.5, 200, 400, 900])
def test_ecp5_pll_makes_the_fastest_clock_within_its_limits(mhz):
    target = round(mhz * 1e6)
    clki, fb, op, out = ecp5_pll(OSC, target)
    assert out == OSC * fb // clki and OSC * fb % clki == 0
    assert 3.125e6 <= OSC / clki <= 400e6 and 400e6 <= out * op <= 800e6
    assert 1 <= clki <= 128 and 1 <= fb <= 80 and 1 <= op <= 128
    assert out == fastest_by_formula(OSC, target) == pll_clock("ecp5", OSC, target)


def test_known_settings():
    """By hand: 25 MHz / 5 x 18 = 90 MHz (VCO 450); 92 MHz has no setting, 25 / 8 x 29 =
    90.625 MHz is the fastest below it; the boards' own PLL clocks are kept exactly."""
    assert ecp5_pll(OSC, 90_000_000) == (5, 18, 5, 90_000_000)
    assert ecp5_pll(OSC, 92_000_000) == (8, 29, 5, 90_625_000)
    assert ecp5_pll(OSC, OSC) == (1, 1, 16, OSC)                 # the ECPIX-5's
    assert ecp5_pll(48_000_000, 24_000_000) == (2, 1, 17, 24_000_000)   # the OrangeCrab's


def test_refusals():
    with pytest.raises(ValueError, match="makes 3.125 to 400 MHz, not 3 MHz"):
        pll_clock("ecp5", OSC, 3_000_000)
    with pytest.raises(UsageError, match="Board 'icebreaker' cannot run at 20 MHz: hwonnx "
                                         "sets the PLL of ecp5 boards only"):
        at_clock(get_board("icebreaker"), 20_000_000)
    with pytest.raises(UsageError, match="--clock sets a board's PLL: it needs --board"):
        at_clock(get_board("sim"), 20_000_000)


def test_cli_refuses_bad_clocks(tmp_path, capsys):
    for value in ("nan", "0", "-5", "fast"):
        with pytest.raises(SystemExit) as exited:
            main(["build", "digits_mlp", "--board", "ulx3s-85f", "-o", str(tmp_path / "o"),
                  "--clock", value])
        assert exited.value.code == 2
        assert f"expected a clock in MHz, not '{value}'" in capsys.readouterr().err
    assert main(["build", "digits_mlp", "-o", str(tmp_path / "o"), "--clock", "50"]) != 0
    assert "--clock sets a board's PLL: it needs --board" in capsys.readouterr().err
    assert main(["build", "digits_mlp", "--board", "ulx3s-85f", "-o", str(tmp_path / "o"),
                 "--clock", "50", "--ext-memory", "ulx3s-sdram"]) != 0
    assert ("--clock with --ext-memory ulx3s-sdram: the memory's timing (hwonnx/memories.py) "
            "is reckoned in cycles of the board's own 25 MHz clock") in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_board_build_at_a_pll_clock(tmp_path):
    """A ULX3S-85F build at --clock 92: the PLL makes 90.625 MHz; the architecture, the
    folder's record, the PLL cell and the clock constraint all say so, and
    ``hwonnx bitstream`` reads the board back at that clock."""
    from hwonnx.api import build
    result = build(example_path("digits_mlp"), tmp_path, board="ulx3s-85f",
                   calib={"image": load_digits_data()["calib"]}, clock_hz=92_000_000,
                   verilog=False, log=lambda message: None)
    assert result.program.config.clock_hz == 90_625_000
    folder = tmp_path / "board"
    info = json.loads((folder / "hwonnx_board.json").read_text())
    assert info["clock_hz"] == 90_625_000
    assert json.loads((tmp_path / "arch.json").read_text())["clock_hz"] == 90_625_000
    rtlil = (folder / "hwonnx_top.il").read_text()
    assert "cell \\EHXPLLL \\pll" in rtlil
    for name, value in (("CLKI_DIV", 8), ("CLKFB_DIV", 29), ("CLKOP_DIV", 5)):
        assert re.search(rf"parameter \\{name} {value}\n", rtlil), name
    assert 'FREQUENCY NET "pll_clk" 90625000.0 HZ;' in (folder / "hwonnx_top.lpf").read_text()
    board = folder_board(tmp_path)
    assert board.name == "ulx3s-85f" and board.clock_hz == 90_625_000 and board.pll
