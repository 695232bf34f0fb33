"""Reference circuits for the formal proofs, written from ``docs/arithmetic.md`` (and
``hwonnx/golden/rounding.py``'s definition of onnxruntime's rounding), not from ``hdl/``:
combinational Amaranth expressions of the golden formulas, for harnesses to compare a design
with. Each function adds its logic to ``m`` and returns the result's signal.

The ``mutation`` arguments give a deliberately wrong reference, for the tests showing that a
proof fails when the rounding is wrong: ``"half_even"`` (ties to even where the formula rounds
half up), ``"half_down"`` (ties toward -inf), ``"shift_off_by_one"`` (divides by
``2**(shift + 1)``).
"""

from amaranth.hdl import Const, Mux, Signal, signed, unsigned

__all__ = ["round_half_up", "requantize_half_up", "requantize_ort", "clamp",
           "round_bits_even"]


def clamp(m, level, lo, hi, name: str = "spec_y"):
    """``min(max(level, lo), hi)`` as int8 (``clamp`` of docs/arithmetic.md)."""
    raised = Mux(level < lo, lo, level)
    y = Signal(signed(8), name=name)
    m.d.comb += y.eq(Mux(raised > hi, hi, raised))
    return y


def _wrap32(m, acc, bias):
    v = Signal(signed(32), name="spec_v")            # the low 32 bits, as signed: wrap32
    m.d.comb += v.eq(acc + bias)
    return v


def round_half_up(m, p, shift, mutation: str = ""):
    """``(p + 2**(shift-1)) >> shift`` for a signed ``p`` and ``shift`` >= 1: ``p / 2**shift``
    rounded to the nearest integer, ties up (toward +inf), the golden ``requantize``'s
    rounding (docs/arithmetic.md, "Requantization")."""
    s = shift + 1 if mutation == "shift_off_by_one" else shift
    half = Signal(unsigned(66), name="spec_half")
    m.d.comb += half.eq(Const(1, 66) << (s - 1)[:8])
    if mutation == "half_down":          # ties toward -inf: (p + 2**(s-1) - 1) >> s
        m.d.comb += half.eq((Const(1, 66) << (s - 1)[:8]) - 1)
    q = Signal(signed(len(p) + 3), name="spec_q")
    m.d.comb += q.eq((p + half) >> s)
    if mutation == "half_even":          # ties to even: a tie with an odd result goes down
        rest = Signal(unsigned(len(p)), name="spec_rest")
        m.d.comb += rest.eq(p.as_unsigned() & ((Const(1, 66) << s) - 1)[:len(p)])
        m.d.comb += q.eq(((p + half) >> s) - ((rest == half) & ((p + half) >> s)[0]))
    return q


def requantize_half_up(m, acc, bias, mult, shift, zp, lo, hi, mutation: str = ""):
    """``clamp(((v * mult + 2**(shift-1)) >> shift) + zp, lo, hi)`` with ``v = wrap32(acc +
    bias)``: the golden ``requantize``. ``shift`` >= 1."""
    v = _wrap32(m, acc, bias)
    p = Signal(signed(64), name="spec_p")
    m.d.comb += p.eq(v * mult)
    level = Signal(signed(68), name="spec_level")
    m.d.comb += level.eq(round_half_up(m, p, shift, mutation) + zp)
    return clamp(m, level, lo, hi)


def round_bits_even(m, x, drop, name: str):
    """``x`` (unsigned) divided by ``2**drop`` and rounded to an integer, ties to even:
    ``q = x >> drop``, then ``q + 1`` when twice the remainder exceeds ``2**drop`` or equals it
    with ``q`` odd (for ``drop = 0`` the remainder is 0: no rounding)."""
    width = len(x)
    q = Signal(unsigned(width), name=f"{name}_q")
    m.d.comb += q.eq(x >> drop)
    twice_rest = Signal(unsigned(width + 2), name=f"{name}_rest2")
    m.d.comb += twice_rest.eq((x - (q << drop)) << 1)
    unit = Signal(unsigned(width + 2), name=f"{name}_unit")
    m.d.comb += unit.eq(Const(1, width + 2) << drop)
    up = (twice_rest > unit) | ((twice_rest == unit) & q[0])
    rounded = Signal(unsigned(width + 1), name=name)
    m.d.comb += rounded.eq(q + up)
    return rounded


def _to_24_bits(m, x, name: str):
    """``rne24(x)``: ``x`` rounded to its 24 most significant bits, ties to even, at its scale.
    The bits to drop count the powers ``2**(23 + d)`` that ``x`` reaches."""
    width = len(x)
    drop = Signal(range(width + 1), name=f"{name}_drop")
    m.d.comb += drop.eq(sum((x >= (1 << (23 + d))) for d in range(1, width - 23)))
    kept = round_bits_even(m, x, drop, f"{name}_kept")
    result = Signal(unsigned(width + 1), name=name)
    m.d.comb += result.eq(kept << drop)
    return result


def requantize_ort(m, acc, bias, mult, shift, zp, lo, hi, mutation: str = ""):
    """onnxruntime's rounding: ``sign(v) * rne(rne24(rne24(|v|) * mult) / 2**shift)``, then
    the zero point and the clamp (golden ``requantize(..., rounding="ort")``); ``mult`` in
    ``[0, 2**31)``. With ``mutation="half_up_final"`` the last rounding is half away from
    zero instead of to even."""
    v = _wrap32(m, acc, bias)
    magnitude = Signal(unsigned(32), name="spec_mag")
    m.d.comb += magnitude.eq(Mux(v < 0, -v, v))
    a = _to_24_bits(m, magnitude, "spec_a")
    product = Signal(unsigned(64), name="spec_prod")
    m.d.comb += product.eq(a * mult.as_unsigned())
    p = _to_24_bits(m, product, "spec_p24")
    if mutation == "half_up_final":
        rounded = Signal(unsigned(66), name="spec_r")
        m.d.comb += rounded.eq((p + (Const(1, 66) << (shift - 1)[:8])) >> shift)
    else:
        rounded = round_bits_even(m, p, shift, "spec_r")
    signed_value = Signal(signed(68), name="spec_signed")
    m.d.comb += signed_value.eq(Mux(v < 0, -rounded, rounded))
    level = Signal(signed(69), name="spec_level")
    m.d.comb += level.eq(signed_value + zp)
    return clamp(m, level, lo, hi)
