"""onnxruntime's requantization rounding in integer hardware (``ArchConfig.ort_rounding``).

onnxruntime's int8 kernels compute ``round_half_even(float32(float32(v) * M))`` with a float32
multiplier ``M``. When ``M = mult * 2**-shift`` exactly (``mult`` with at most 24 significant
bits, as the quantizer makes it for a pre-quantized model), that is, on integers::

    a = rne24(|v|)                      # float32(v): 24 significant bits, ties to even
    p = rne24(a * mult)                 # the float32 product (the power of two is exact)
    y = sign(v) * rne(p / 2**shift)     # to an integer, ties to even

where ``rne24(x)`` rounds ``x`` to its 24 most significant bits (keeping its scale). The golden
model is :func:`hwonnx.golden.ops.requantize` with ``rounding="ort"``; a test compares both with
NumPy's float32 arithmetic.
"""

from amaranth.hdl import Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["OrtRounder", "ORT_LATENCY"]

#: Cycles from ``v`` to ``y``.
ORT_LATENCY = 4


def _bit_length(m: Module, value, name: str) -> Signal:
    """Combinational index of the highest set bit plus one (0 for 0)."""
    length = Signal(range(len(value) + 1), name=name)
    for i in range(len(value)):               # the last assignment (highest bit) wins
        with m.If(value[i]):
            m.d.comb += length.eq(i + 1)
    return length


def _round_low_bits(m: Module, value, drop, name: str):
    """``value`` with its ``drop`` lowest bits rounded away, ties to even, at its scale
    (one bit wider than ``value``)."""
    width = len(value)
    mask = Signal(width, name=f"{name}_mask")
    m.d.comb += mask.eq((Const(1, width + 1) << drop)[:width] - 1)
    rest = value & mask
    half = (mask + 1) >> 1
    kept = value & ~mask
    up = (drop != 0) & ((rest > half) | ((rest == half) & value.bit_select(drop, 1)))
    rounded = Signal(width + 1, name=name)
    m.d.comb += rounded.eq(kept + Mux(up, mask + 1, 0))
    return rounded


class OrtRounder(wiring.Component):
    """One lane of onnxruntime-exact requantization, pipelined.

    Members
    -------
    v : ``In(signed(32))`` the biased accumulator, sampled every cycle.
    even : ``In(1)`` onnxruntime's rounding; 0: the default rounding of
        :func:`hwonnx.golden.ops.requantize` (exact product, ties toward +inf), so that one
        unit serves both. Held constant like ``mult``.
    mult : ``In(signed(32))`` (non-negative), shift : ``In(unsigned(8))`` (1 to 63): held
        constant while values are in flight (the post-processor's parameters are).
    y : ``Out(signed(66))`` the rounded ``v * mult * 2**-shift``, :data:`ORT_LATENCY` cycles
        after ``v``.
    """

    v: In(signed(32))
    even: In(1)
    mult: In(signed(32))
    shift: In(unsigned(8))
    y: Out(signed(66))

    def elaborate(self, platform):
        m = Module()
        # 1: float32(v), kept as a magnitude of at most 33 bits and a sign.
        magnitude = Signal(32)
        m.d.comb += magnitude.eq(Mux(self.v < 0, -self.v, self.v))
        length = _bit_length(m, magnitude, "v_length")
        drop = Signal(range(9))
        m.d.comb += drop.eq(Mux(self.even & (length > 24), length - 24, 0))
        a = Signal(33)
        negative = [Signal(name=f"negative_{i}") for i in range(ORT_LATENCY - 1)]
        m.d.sync += [a.eq(_round_low_bits(m, magnitude, drop, "a_rounded")),
                     negative[0].eq(self.v < 0)]
        for earlier, later in zip(negative, negative[1:]):
            m.d.sync += later.eq(earlier)
        # 2: the exact product.
        product = Signal(64)
        m.d.sync += product.eq(a * self.mult.as_unsigned()[:31])
        # 3: the float32 product: 24 significant bits.
        p_length = _bit_length(m, product, "p_length")
        p_drop = Signal(range(41))
        m.d.comb += p_drop.eq(Mux(self.even & (p_length > 24), p_length - 24, 0))
        p = Signal(65)
        m.d.sync += p.eq(_round_low_bits(m, product, p_drop, "p_rounded"))
        # 4: to an integer, ties to even.
        low = Signal(65)
        m.d.comb += low.eq((Const(1, 66) << self.shift)[:65] - 1)
        quotient = Signal(65)
        m.d.comb += quotient.eq(p >> self.shift)
        rest, half = p & low, (low + 1) >> 1
        # A tie goes to the even neighbour, or (half up) away from zero for a positive value
        # and toward zero for a negative one.
        up = (rest > half) | ((rest == half) & Mux(self.even, quotient[0], ~negative[-1]))
        rounded = Signal(66)
        m.d.comb += rounded.eq(quotient + up)
        m.d.sync += self.y.eq(Mux(negative[-1], -rounded, rounded))
        return m
