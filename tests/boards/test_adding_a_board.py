"""docs/adding-a-board.md, followed as written: a board made of the nine arguments of its
section 6 (a copy of the ULX3S 25F under another name, with fewer LUTs), registered in
``BOARDS`` for one test at a time (``monkeypatch``: no other test sees it), passes the checks
``tests/boards/test_boards.py`` runs on every registered board and builds its sources against its
own capacities; the doc's script runs; every name the doc gives exists."""

import dataclasses
import json
import re
from pathlib import Path

import pytest

from hwonnx import api
from hwonnx.boards import BOARDS, FAMILIES, Board, Family, check_fits, get_board
from hwonnx.boards import build as board_build
from hwonnx.boards import clocks, platforms, registry
from hwonnx.boards import top as board_top
from hwonnx.cli import main
from hwonnx.errors import ResourceError
from hwonnx.examples import example_path, load_digits_data

from tests.boards import test_boards as every_board

DOC = Path(__file__).resolve().parents[2] / "docs" / "adding-a-board.md"
NAME = "my-ulx3s"
LUTS = 20000            # the ULX3S 25F's LFE5U-25F has 24288


@pytest.fixture(scope="module")
def calib():
    return {"image": load_digits_data()["calib"]}


def _board(luts: int = LUTS) -> Board:
    """The doc's section 6: ``name``, ``description``, ``platform_path``, ``family``, ``dsp``,
    ``bram_kbits``, ``luts``, ``default_config`` and ``clock_hz``, then ``ext_memory`` by
    keyword; the default architecture is the ULX3S 25F's."""
    return Board(NAME, "my own ULX3S", "ulx3s:ULX3S_25F_Platform", "ecp5", 28, 1008, luts,
                 BOARDS["ulx3s-25f"].default_config, 25_000_000, ext_memory="ulx3s-sdram")


@pytest.fixture
def board(monkeypatch):
    board = _board()
    monkeypatch.setitem(BOARDS, board.name, board)
    return board


def test_the_new_board_passes_the_checks_of_every_board(board, tmp_path, calib, capsys):
    """Section 7: the checks tests/boards/test_boards.py makes of each registered board, and
    ``hwonnx boards`` lists it."""
    assert get_board(NAME) is board
    every_board.test_default_config_fits_its_device(NAME)
    every_board.test_board_build_sources(tmp_path, NAME, calib)
    assert main(["boards"]) == 0
    row = next(r for r in capsys.readouterr().out.splitlines() if r.startswith(NAME + " "))
    assert row.split()[1:6] == ["4x3", "25MHz", "28", "1008", str(LUTS)]
    assert row.endswith("my own ULX3S")


def test_the_build_writes_the_board_sources_and_fits_the_new_capacities(board, tmp_path,
                                                                        calib):
    """``api.build`` for the new board writes ``board/`` (the build script, the HDL, the ECP5
    constraints, hwonnx_board.json naming the board), and the fit check and the report use
    the new board's capacities, not those of the board it copies."""
    result = api.build(example_path("digits_mlp"), tmp_path / "out", board=NAME, calib=calib,
                       verilog=False, log=lambda message: None)
    folder = tmp_path / "out" / "board"
    files = {p.name for p in folder.iterdir()}
    assert {"build_hwonnx_top.sh", "hwonnx_top.il", "hwonnx_top.lpf",
            "hwonnx_board.json"} <= files
    info = json.loads((folder / "hwonnx_board.json").read_text())
    assert (info["board"], info["family"], info["clock_hz"]) == (NAME, "ecp5", 25_000_000)
    resources = result.report["resources"]
    assert (resources["luts"]["device"], resources["dsp"]["device"]) == (LUTS, 28)
    assert resources["bram_blocks"]["device"] == 1008 * 1024 // FAMILIES["ecp5"].block_bits
    assert result.report["board"] == NAME
    used = check_fits(result.program.config, board)
    assert resources["luts"]["used"] == used.luts < LUTS


def test_the_fit_check_refuses_what_the_new_board_cannot_hold(monkeypatch, calib):
    """The same board with fewer LUTs than the default architecture needs: the build is
    refused by the fit check, naming the new board and its capacity."""
    small = _board(luts=4000)
    monkeypatch.setitem(BOARDS, small.name, small)
    with pytest.raises(ResourceError, match=r"^The 4x3 accelerator does not fit board "
                       r"'my-ulx3s': about \d+ logic cells but the device has 4000; try a "
                       r"smaller array or smaller buffers"):
        api.build(example_path("digits_mlp"), None, board=NAME, calib=calib,
                  log=lambda message: None)


def test_the_docs_script_runs(monkeypatch, tmp_path):
    """Section 6's script, run as written (its ``"out"`` in a temporary folder): it registers
    the board and builds the bundled example for it."""
    script = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)[-1]
    assert 'BOARDS[board.name] = board' in script
    monkeypatch.chdir(tmp_path)
    # The script adds the board to BOARDS itself: this entry is undone after the test, and
    # with it the script's.
    monkeypatch.setitem(BOARDS, NAME, None)
    exec(compile(script, str(DOC), "exec"), {})
    assert get_board(NAME) == dataclasses.replace(BOARDS["ulx3s-25f"], name=NAME,
                                                  description="my own ULX3S", luts=LUTS)
    info = json.loads((tmp_path / "out" / "board" / "hwonnx_board.json").read_text())
    assert info["board"] == NAME


def test_the_names_the_doc_gives_exist():
    """Every field, table, function and test the doc names is there."""
    text = " ".join(DOC.read_text().split())
    fields = [f.name for f in dataclasses.fields(Board)]
    assert fields[:9] == ["name", "description", "platform_path", "family", "dsp",
                          "bram_kbits", "luts", "default_config", "clock_hz"]
    assert ("The nine arguments are `" + "`, `".join(fields[:8]) + "` and `clock_hz`; then, "
            "by keyword, `pll`, `huge_rams` and `ext_memory`") in text
    assert fields[9:] == ["pll", "huge_rams", "ext_memory"]
    for name in ("mults_per_dsp", "dsps_per_wide_mult", "block_bits", "block_widths",
                 "luts_per_pe", "luts_base", "open_flow", "luts_per_mult", "spill_luts",
                 "huge_bits", "huge_width"):
        assert f"`{name}`" in text and name in {f.name for f in dataclasses.fields(Family)}
    assert set(FAMILIES) == {"ice40", "ecp5", "gowin", "xilinx7", "cyclonev"}
    for table in ("YOWASP_TOOLS", "NEXTPNR_CELLS", "SYNTH_OPTS", "AFTER_READ"):
        assert f"`{table}`" in text and hasattr(board_build, table)
    assert board_top.DEFAULT_BAUD == 115_200 and callable(board_top.uart_divisor)
    assert callable(clocks.pll_domain) and callable(registry._cfg)
    for cls in ("UpduinoV3UARTPlatform", "OrangeCrab25FUARTPlatform", "ArtyZ720UARTPlatform"):
        assert hasattr(platforms, cls)
    assert board_build.TOP_NAME == "hwonnx_top"
    for test in ("test_default_config_fits_its_device", "test_board_build_sources",
                 "test_open_flow_families_have_their_yowasp_tools"):
        assert f"`{test}`" in text and hasattr(every_board, test)
    assert "PLAN_FILES" in text and hasattr(every_board, "PLAN_FILES")
    # The PLL recipes the doc names are the ones clocks.py has.
    source = Path(clocks.__file__).read_text()
    assert re.findall(r'family == "(\w+)"', source) == ["ecp5", "xilinx7"]
