"""Formal proofs of the post-processor's requantization steps after the multiply, for every
input (SymbiYosys + Yices, :mod:`formal_helpers`); the reference is :mod:`formal_specs`,
written from docs/arithmetic.md.

- The clamp: ``PostProcessor._range`` and ``_choose`` (the HDL's own functions, called on a
  free 67-bit level) equal ``min(max(level, lo), hi)`` for every level and every int8
  ``lo <= hi``. For ``lo > hi`` (which the ISA can encode) they differ: a test keeps the
  counterexample.
- The rounding shift: docs/arithmetic.md's hardware identity (``((p >> (shift - 1)) + 1) >>
  1``, which ``hdl/post.py`` computes in fewer bits: the next proof) equals the golden
  ``(p + 2**(shift-1)) >> shift`` for every 64-bit product and every shift in [1, 63]; with
  the reference's rounding mutated (ties to even, ties down, the shift off by one) the proof
  fails.

- The narrow rounding shift: ``hdl/post.py``'s :func:`~hwonnx.hdl.post.narrow_shift` (the
  result in :data:`~hwonnx.hdl.post.SHIFTED_BITS` bits and a flag) and
  :func:`~hwonnx.hdl.post.round_narrow`, then the zero point and the clamp, give
  ``clamp(round_half_up(p, shift) + zp, lo, hi)`` for every 64-bit product, shift in [1, 63],
  int8 zero point and int8 ``lo <= hi``; without the flag, or with a bit fewer than
  ``SHIFTED_BITS``, the proof fails.

All are combinational: a bounded model check of depth 1. The whole-requantization references
of :mod:`formal_specs` (half up and onnxruntime's rounding), which no proof here uses yet (the
pipeline's proof did not finish: docs/testing.md), are checked against the golden model by
simulation.
"""

import pytest
from amaranth.hdl import Assert, Assume, Module, Signal, signed, unsigned

from hwonnx.hdl.post import SHIFTED_BITS, PostProcessor, narrow_shift, round_narrow

from formal_helpers import bmc, tools_missing
from formal_specs import clamp, round_half_up

@pytest.fixture(autouse=True)
def _formal_tools():
    """The tools come with the test extra: missing, the proofs fail (never skip)."""
    if tools_missing():
        pytest.fail(f"the proofs need {', '.join(tools_missing())}: pip install -e '.[test]'")


def clamp_harness(any_bounds: bool = False):
    m = Module()
    level, lo, hi = Signal(signed(67)), Signal(signed(8)), Signal(signed(8))
    y = Signal(signed(8))
    m.d.comb += y.eq(PostProcessor._choose(*PostProcessor._range(level), lo, hi))
    if not any_bounds:
        m.d.comb += Assume(lo <= hi)
    m.d.comb += Assert(y == clamp(m, level, lo, hi))
    return m, [level, lo, hi]


def test_clamp_proved(tmp_path):
    m, ports = clamp_harness()
    proof = bmc(m, ports, 1, tmp_path)
    assert proof.passed, proof.log


def test_clamp_with_lo_above_hi_differs(tmp_path):
    """``lo > hi``: docs/arithmetic.md's clamp gives ``hi``, the HDL ``lo`` for a level below
    ``lo`` (for example level -128, lo 1, hi 0). The quantizer's ``clamp_bounds`` keeps
    ``lo <= hi``."""
    m, ports = clamp_harness(any_bounds=True)
    proof = bmc(m, ports, 1, tmp_path)
    assert proof.status == "FAIL", proof.log


def shift_harness(mutation: str = ""):
    m = Module()
    p, shift = Signal(signed(64)), Signal(unsigned(8))
    m.d.comb += Assume((shift >= 1) & (shift <= 63))
    halved = Signal(signed(64))                      # hdl/post.py's rounding shift
    rounded = Signal(signed(65))
    m.d.comb += [halved.eq(p >> (shift - 1)[:6]), rounded.eq((halved + 1) >> 1)]
    m.d.comb += Assert(rounded == round_half_up(m, p, shift, mutation))
    return m, [p, shift]


def test_rounding_shift_proved(tmp_path):
    m, ports = shift_harness()
    proof = bmc(m, ports, 1, tmp_path)
    assert proof.passed, proof.log


@pytest.mark.parametrize("mutation", ["half_even", "half_down", "shift_off_by_one"])
def test_rounding_shift_mutation_fails(tmp_path, mutation):
    m, ports = shift_harness(mutation)
    proof = bmc(m, ports, 1, tmp_path)
    assert proof.status == "FAIL", proof.log


def test_reference_matches_golden_at_ties():
    """The reference itself, simulated, against the golden model's examples (docs)."""
    from amaranth.sim import Simulator

    m = Module()
    p, shift = Signal(signed(64)), Signal(unsigned(8))
    out = {mut: round_half_up(m, p, shift, mut) for mut in ("", "half_even", "half_down")}
    seen = []

    async def bench(ctx):
        for value, s in ((-5, 31), (-3, 31), (-1, 31), (1, 31), (3, 31), (5, 31),
                         (-(1 << 32), 1), ((1 << 32) - 1, 1)):
            ctx.set(p, value << (s - 1))
            ctx.set(shift, s)
            seen.append((value, *(ctx.get(out[k]) for k in ("", "half_even", "half_down"))))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    # value / 2 rounded: half up, to even, half down
    assert seen[:6] == [(-5, -2, -2, -3), (-3, -1, -2, -2), (-1, 0, 0, -1), (1, 1, 0, 0),
                        (3, 2, 2, 1), (5, 3, 2, 2)]
    assert seen[6][1:] == (-(1 << 31),) * 3 and seen[7][1] == 1 << 31


def test_requantize_references_match_golden():
    """The whole-pipeline references of :mod:`formal_specs` (both rounding modes), simulated on
    random operands and the edges, equal ``hwonnx.golden.requantize``."""
    import numpy as np
    from amaranth.sim import Simulator

    from formal_specs import requantize_half_up, requantize_ort
    from hwonnx.golden import requantize

    m = Module()
    ins = [Signal(signed(32)), Signal(signed(32)), Signal(signed(32)), Signal(unsigned(8)),
           Signal(signed(8)), Signal(signed(8)), Signal(signed(8))]
    outs = {"half_up": requantize_half_up(m, *ins), "ort": requantize_ort(m, *ins)}
    rng = np.random.default_rng(39)
    cases = [(-(1 << 31), -(1 << 31), (1 << 31) - 1, 1, 0, -128, 127),
             ((1 << 31) - 1, 0, (1 << 31) - 1, 63, 5, -128, 127)]
    cases += [(v, 0, 1 << 30, 31, 0, -128, 127) for v in range(-9, 10, 2)]  # v / 2: ties
    for _ in range(300):
        acc, bias = (int(x) for x in rng.integers(-(1 << 31), 1 << 31, 2))
        mult, shift = int(rng.integers(0, 1 << 31)), int(rng.integers(1, 64))
        if rng.random() < 0.5:                      # into the int8 range, near ties
            shift = int(rng.integers(28, 40))
            acc, bias = int(rng.integers(-(1 << 12), 1 << 12)) << 10, 0
        zp, lo = (int(x) for x in rng.integers(-128, 128, 2))
        cases.append((acc, bias, mult, shift, zp, lo, int(rng.integers(lo, 128))))
    got = []

    async def bench(ctx):
        for case in cases:
            for signal, value in zip(ins, case):
                ctx.set(signal, value)
            got.append((ctx.get(outs["half_up"]), ctx.get(outs["ort"])))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    for case, (half_up, ort) in zip(cases, got):
        acc, bias, mult, shift, zp, lo, hi = case
        args = (np.array([acc], np.int32), np.array([bias], np.int32),
                np.array([mult], np.int64), np.array([shift], np.int64), zp, lo, hi)
        assert half_up == requantize(*args)[0], case
        assert ort == requantize(*args, rounding="ort")[0], case
    assert sum(h != o for h, o in got) == 5           # the ties whose even neighbour is lower


def narrow_harness(mutation: str = ""):
    """The post-processor's narrow path from the product to the clamped value, against the
    reference on the whole product. ``mutation``: ``no_flag`` ignores the flag, ``narrower``
    keeps a bit fewer of the shifted product."""
    m = Module()
    p, shift = Signal(signed(64)), Signal(unsigned(8))
    zp, lo, hi = Signal(signed(8)), Signal(signed(8)), Signal(signed(8))
    m.d.comb += [Assume((shift >= 1) & (shift <= 63)), Assume(lo <= hi)]
    width = SHIFTED_BITS - (mutation == "narrower")
    h, outside = narrow_shift(m, p, (shift - 1)[:6], "shift", width)
    level = Signal(signed(SHIFTED_BITS + 1))
    m.d.comb += level.eq(round_narrow(h, 0 if mutation == "no_flag" else outside, p[63]) + zp)
    y = Signal(signed(8))
    m.d.comb += y.eq(PostProcessor._choose(*PostProcessor._range(level), lo, hi))
    m.d.comb += Assert(y == clamp(m, round_half_up(m, p, shift) + zp, lo, hi))
    return m, [p, shift, zp, lo, hi]


def test_narrow_rounding_proved(tmp_path):
    m, ports = narrow_harness()
    proof = bmc(m, ports, 1, tmp_path)
    assert proof.passed, proof.log


@pytest.mark.parametrize("mutation", ["no_flag", "narrower"])
def test_narrow_rounding_mutation_fails(tmp_path, mutation):
    m, ports = narrow_harness(mutation)
    proof = bmc(m, ports, 1, tmp_path)
    assert proof.status == "FAIL", proof.log
