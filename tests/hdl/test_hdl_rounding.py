"""hdl/rounding.py (onnxruntime-exact requantization rounding) in the Amaranth simulator
against the golden integer function, which in turn equals NumPy's float32 arithmetic (the
arithmetic onnxruntime's int8 kernels use) for every float32 multiplier."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from hwonnx.golden.rounding import ort_round
from hwonnx.hdl.rounding import ORT_LATENCY, OrtRounder


def float32_scale(scale: float) -> "tuple[np.float32, int, int]":
    """A float32 multiplier and its ``mult * 2**-shift`` with ``mult`` in [2**30, 2**31)."""
    scale = np.float32(scale)
    fraction, exponent = np.frexp(np.float64(scale))
    return scale, int(fraction * 2**31), 31 - int(exponent)


def samples(rng, count: int) -> np.ndarray:
    """Accumulators of every size, with many exact ties for both roundings."""
    kinds = [rng.integers(-2**31, 2**31, count), rng.integers(-2**14, 2**14, count),
             (rng.integers(-2**8, 2**8, count) * 2 + 1) << rng.integers(0, 9, count),
             (2**24 + rng.integers(-4, 5, count)) * rng.choice([-1, 1, 2, 4, 8], count)]
    return np.concatenate(kinds)


@pytest.mark.parametrize("seed", range(4))
def test_golden_equals_float32(seed):
    rng = np.random.default_rng(seed)
    for _ in range(200):
        exact_tie = rng.random() < 0.3
        scale, mult, shift = float32_scale(2.0 ** -int(rng.integers(1, 33)) if exact_tie
                                           else rng.uniform(1e-9, 4.0))
        v = samples(rng, 32)
        want = np.rint(v.astype(np.float32) * scale).astype(np.int64)
        np.testing.assert_array_equal(ort_round(v, mult, shift), want)


def test_golden_differs_from_half_up_on_ties():
    """Ties go to the even neighbour (2.5 -> 2, -2.5 -> -2), unlike the default rounding."""
    _, mult, shift = float32_scale(0.5)
    np.testing.assert_array_equal(ort_round(np.array([5, -5, 7, -7]), mult, shift),
                                  [2, -2, 4, -4])


@pytest.mark.parametrize("even", [1, 0])
@pytest.mark.parametrize("seed", range(3))
def test_rtl_equals_golden(seed, even):
    """``even``: onnxruntime's rounding; otherwise the default rounding of ``requantize``
    (the same unit serves both)."""
    rng = np.random.default_rng(100 + seed)
    scale = 2.0 ** -int(rng.integers(1, 20)) if seed == 0 else rng.uniform(1e-6, 2.0)
    _, mult, shift = float32_scale(scale)
    if seed == 2:                 # a multiplier with all 31 bits significant
        mult |= int(rng.integers(0, 1 << 7))
    values = samples(rng, 150)
    dut = OrtRounder()
    got = []

    async def bench(ctx):
        ctx.set(dut.mult, mult)
        ctx.set(dut.shift, shift)
        ctx.set(dut.even, even)
        for cycle in range(len(values) + ORT_LATENCY):
            if cycle < len(values):
                ctx.set(dut.v, int(values[cycle]))
            if cycle >= ORT_LATENCY:
                got.append(ctx.get(dut.y))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    if even:
        want = ort_round(values, mult, shift)
    else:
        want = np.array([_half_up(int(v), mult, shift) for v in values])
    np.testing.assert_array_equal(np.array(got), want)


def _half_up(v: int, mult: int, shift: int) -> int:
    """The default rounding of ``requantize`` before the zero point and the clamp (its
    formula, in Python integers; ``requantize`` itself clamps to int8)."""
    return (v * mult + (1 << (shift - 1))) >> shift
