"""A multiplier with its operands and its product in registers, in a DSP block's own registers
where the board's family has them."""

from amaranth.hdl import ClockSignal, Instance, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["RegisteredMultiplier", "MULT_LATENCY", "PIPELINED_MULT_LATENCY", "logic_product"]

#: Cycles from the operands to their product: the operand registers, then the product's.
MULT_LATENCY = 2
#: The same with a register in the middle of the multiply (``latency=3``): the DSP block's
#: pipeline register, or the middle of :func:`logic_product`'s adder tree.
PIPELINED_MULT_LATENCY = 3


class RegisteredMultiplier(wiring.Component):
    """``p`` is ``a * b`` of ``latency`` cycles before (both signed, at most 18 bits; an
    unsigned operand is given one bit wider): :data:`MULT_LATENCY` (operand and product
    registers) or :data:`PIPELINED_MULT_LATENCY` (and a register in the middle).

    On an ECP5 board (the platform's family ``ecp5``) it is one MULT18X18D that holds both
    registers itself (``REG_INPUTA``, ``REG_INPUTB``, ``REG_OUTPUT`` on ``CLK0``, always
    enabled, never reset): Yosys maps a ``$mul`` to a combinational MULT18X18D and does not
    move the flip-flops around it into the block, and the routing into and out of the block
    (4-5 ns each way) beside its 3.9 ns held ECP5 builds at 74-86 MHz. Elsewhere (simulation,
    the other families) the same two registers are in logic. The block's registers start at
    0 with its global reset disabled (``GSR``), as the logic's do. With ``latency`` 3 the
    block's pipeline register (``REG_PIPELINE``) is the middle one.

    ``in_logic``: the logic's registers and :func:`logic_product` between them on every
    platform, for a PE beyond a device's DSP blocks (``boards/fit.py``); with ``latency`` 3
    the middle register splits its adder tree.

    Members
    -------
    a : ``In(signed(a_width))``. b : ``In(signed(b_width))``.
    p : ``Out(signed(a_width + b_width))``.
    """

    def __init__(self, a_width: int, b_width: int, in_logic: bool = False,
                 latency: int = MULT_LATENCY):
        if not (1 <= a_width <= 18 and 1 <= b_width <= 18):
            raise ValueError(f"RegisteredMultiplier takes operands of 1 to 18 bits, not "
                             f"{a_width} and {b_width}")
        if latency not in (MULT_LATENCY, PIPELINED_MULT_LATENCY):
            raise ValueError(f"RegisteredMultiplier's latency is {MULT_LATENCY} or "
                             f"{PIPELINED_MULT_LATENCY}, not {latency}")
        self._in_logic, self._latency = in_logic, latency
        super().__init__({"a": In(signed(a_width)), "b": In(signed(b_width)),
                          "p": Out(signed(a_width + b_width))})

    def elaborate(self, platform):
        m = Module()
        if getattr(platform, "family", None) == "ecp5" and not self._in_logic:
            a, b, p = Signal(signed(18)), Signal(signed(18)), Signal(signed(36))
            m.d.comb += [a.eq(self.a), b.eq(self.b), self.p.eq(p)]
            ports = {f"i_A{i}": a[i] for i in range(18)}
            ports.update({f"i_B{i}": b[i] for i in range(18)})
            ports.update({f"i_C{i}": 0 for i in range(18)})
            ports.update({f"o_P{i}": p[i] for i in range(36)})
            registers = {}
            used = ("INPUTA", "INPUTB", "OUTPUT") + (
                ("PIPELINE",) if self._latency == PIPELINED_MULT_LATENCY else ())
            for reg in used:
                registers.update({f"p_REG_{reg}_CLK": "CLK0", f"p_REG_{reg}_CE": "CE0",
                                  f"p_REG_{reg}_RST": "RST0"})
            if "PIPELINE" not in used:
                registers["p_REG_PIPELINE_CLK"] = "NONE"
            m.submodules.block = Instance(
                "MULT18X18D", **registers, p_REG_INPUTC_CLK="NONE",
                p_GSR="DISABLED", p_RESETMODE="SYNC", p_MULT_BYPASS="DISABLED",
                p_CAS_MATCH_REG="FALSE", p_SOURCEB_MODE="B_SHIFT",
                i_CLK0=ClockSignal(), i_CE0=1, i_RST0=0, i_SIGNEDA=1, i_SIGNEDB=1,
                i_SOURCEA=0, i_SOURCEB=0, **ports)
            return m
        a, b = Signal.like(self.a), Signal.like(self.b)
        m.d.sync += [a.eq(self.a), b.eq(self.b)]
        middle = self._latency == PIPELINED_MULT_LATENCY
        if self._in_logic:
            product = logic_product(m, a, b, middle=middle)
        elif middle:
            product = Signal.like(self.p, name="middle")
            m.d.sync += product.eq(a * b)
        else:
            product = a * b
        m.d.sync += self.p.eq(product)
        return m


def logic_product(m: Module, a, b, middle: bool = False):
    """``a * b`` (both signed) as a sum of partial products with no ``$mul`` for a synthesis
    tool to put into a DSP block: ``a`` times each bit of ``b`` in a tree of adders, the sign
    bit's term subtracted. Each sum is a wire marked ``keep``, so that Yosys maps every adder
    to a carry chain instead of merging the tree into one ``$macc`` of plain gates (an 8x8
    product on ECP5: 36 CCU2C and 65 LUT4, where the merged tree took 311 LUT4 and Yosys's
    ``booth`` pass on a ``$mul`` 170 LUT4 and 8 CCU2C; and 180 ``booth`` products in a 16x16
    board top tripped an assertion of Yosys 0.70's ABC9 reintegration).

    ``middle``: the sums of the tree's first two levels and the sign bit's term go into
    registers (the result is a cycle later), so that no path runs through more than two of
    the four carry chains in series."""
    terms = [Mux(b[i], a, 0) << i for i in range(len(b) - 1)]
    sign = Mux(b[-1], a, 0) << (len(b) - 1)
    if middle and len(terms) < 3:
        raise ValueError(f"logic_product splits a tree of at least two levels, not {len(b)} bits")
    level = 0
    while len(terms) > 1:
        summed = []
        for i in range(0, len(terms) - 1, 2):
            total = terms[i] + terms[i + 1]
            wire = Signal(total.shape(), name=f"partial_{level}_{i // 2}", attrs={"keep": 1})
            m.d.comb += wire.eq(total)
            summed.append(wire)
        terms = summed + terms[len(terms) - len(terms) % 2:]
        level += 1
        if middle and level == 2:
            held = [Signal(term.shape(), name=f"middle_{i}") for i, term in
                    enumerate(terms + [sign])]
            m.d.sync += [reg.eq(term) for reg, term in zip(held, terms + [sign])]
            terms, sign = held[:-1], held[-1]
    return terms[0] - sign
