"""Slow tier: a real bitstream of the bundled example for one board of each open family, with
the YoWASP tools from PyPI: ECP5 (ULX3S 85F, about 5 minutes on these machines), Gowin (Tang
Nano 9K, nextpnr-himbaechel and Apicula's gowin_pack) and iCE40 (UPduino v3, the platform
hwonnx completes with a UART; the default tier builds the iCEBreaker). Run with
``pytest -m slow``; they need ``pip install -e '.[bitstream]'``."""

import shutil
import sys
from pathlib import Path

import pytest

from hwonnx.api import build
from hwonnx.boards.build import YOWASP_TOOLS
from hwonnx.examples import example_path, load_digits_data

pytestmark = pytest.mark.slow


def _build(tmp_path, board):
    family = {"ulx3s-85f": "ecp5", "tang-nano-9k": "gowin", "upduino-v3": "ice40"}[board]
    here = str(Path(sys.executable).parent)
    missing = [tool for tool in YOWASP_TOOLS[family].values()
               if shutil.which(tool) is None and shutil.which(tool, path=here) is None]
    if missing:
        pytest.fail(f"the slow tier needs {', '.join(missing)} of the bitstream extra: "
                    f"pip install -e '.[bitstream]'")
    result = build(example_path("digits_mlp"), tmp_path, board=board,
                   calib={"image": load_digits_data()["calib"]}, verilog=False, bitstream=True,
                   log=print)
    report = result.report["bitstream"]
    assert report["fmax_mhz"] >= report["target_mhz"]
    return report


def test_ulx3s_bitstream_of_bundled_example(tmp_path):
    report = _build(tmp_path, "ulx3s-85f")
    assert (tmp_path / "board" / "hwonnx_top.bit").stat().st_size > 100_000
    assert report["target_mhz"] == 25.0
    assert report["utilization"]["MULT18X18D"]["used"] <= 156


def test_tang_nano_9k_bitstream_of_bundled_example(tmp_path):
    report = _build(tmp_path, "tang-nano-9k")
    assert (tmp_path / "board" / "hwonnx_top.fs").stat().st_size > 100_000
    assert report["target_mhz"] == 27.0
    usage = report["utilization"]
    assert usage["LUT4"]["used"] <= usage["LUT4"]["total"]


def test_upduino_v3_bitstream_of_bundled_example(tmp_path):
    report = _build(tmp_path, "upduino-v3")
    # An iCE40 UP5K bitstream is 104,090 bytes whatever the design.
    assert (tmp_path / "board" / "hwonnx_top.bin").stat().st_size == 104_090
    assert report["target_mhz"] == 12.0
    assert report["utilization"]["ICESTORM_SPRAM"]["used"] == 4
