"""Every registered board: the fit check, and complete build sources from amaranth-boards'
``do_build=False`` build plan with the bundled example baked in (no toolchain needed)."""

import json

import pytest

from hwonnx.api import build
from hwonnx.boards import BOARDS, check_fits, estimate, get_board
from hwonnx.config import ArchConfig
from hwonnx.errors import ResourceError
from hwonnx.examples import example_path, load_digits_data

BOARD_NAMES = sorted(name for name, board in BOARDS.items() if not board.is_simulation)
# What each family's build plan must contain besides the HDL.
PLAN_FILES = {"ice40": (".pcf", ".ys"), "ecp5": (".lpf", ".ys"), "xilinx7": (".xdc", ".tcl"),
              "cyclonev": (".qsf", ".sdc"), "gowin": (".cst", ".ys")}


@pytest.fixture(scope="module")
def calib():
    return {"image": load_digits_data()["calib"]}


@pytest.mark.parametrize("name", [n for n in BOARD_NAMES if n != "icebreaker"])
def test_board_build_sources(tmp_path, name, calib):
    board = get_board(name)
    result = build(example_path("digits_mlp"), tmp_path, board=name, calib=calib,
                   verilog=False, log=lambda message: None)
    assert result.program.config.clock_hz == board.clock_hz
    folder = tmp_path / "board"
    info = json.loads((folder / "hwonnx_board.json").read_text())
    assert info["board"] == name and info["clock_hz"] == board.clock_hz
    files = [p.name for p in folder.iterdir()]
    assert "build_hwonnx_top.sh" in files
    for suffix in PLAN_FILES[board.family]:
        assert any(f.endswith(suffix) for f in files), (suffix, files)
    hdl = "".join(p.read_text() for p in folder.iterdir() if p.suffix in (".v", ".il"))
    assert "hwonnx_top" in hdl


def test_icebreaker_refuses_with_numbers(calib):
    """The UP5K has 8 DSP blocks and 30 block RAMs; the current architecture's 384-bit
    instruction word and 32x32 requantizers do not fit, and hwonnx says so before
    synthesis instead of letting Yosys overflow the device."""
    with pytest.raises(ResourceError, match=r"^The 2x2 accelerator does not fit board "
                       r"'icebreaker': 12 DSP blocks for a 2x2 array \(4 multipliers \+ 2 "
                       r"requantizers\) but the device has 8; \d+ block RAMs but the device "
                       r"has 30 \(largest: the prog buffer, \d+ blocks\); try a smaller array "
                       r"or smaller buffers .*$"):
        build(example_path("digits_mlp"), None, board="icebreaker", calib=calib,
              log=lambda message: None)


def test_fit_check_counts_dsp_per_family():
    """One DSP block per 8x8 product (Yosys does not pack two into one block), four per
    32x32 requantizer; Cyclone V packs three 9x9 products per block."""
    config = ArchConfig(rows=4, cols=4)
    assert estimate(config, get_board("ulx3s-85f")).dsp == 16 + 4 * 4
    assert estimate(config, get_board("de10-nano")).dsp == 6 + 4 * 2
    with pytest.raises(ResourceError, match=r"^The 16x16 accelerator does not fit board "
                       r"'arty-a7-35': 320 DSP blocks .* but the device has 90; .*$"):
        check_fits(ArchConfig(rows=16, cols=16), get_board("arty-a7-35"))
