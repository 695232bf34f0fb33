"""A multiplier with its operands and its product in registers, in a DSP block's own registers
where the board's family has them."""

from amaranth.hdl import ClockSignal, Instance, Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["RegisteredMultiplier", "MULT_LATENCY"]

#: Cycles from the operands to their product: the operand registers, then the product's.
MULT_LATENCY = 2


class RegisteredMultiplier(wiring.Component):
    """``p`` is ``a * b`` of :data:`MULT_LATENCY` cycles before (both signed, at most 18 bits;
    an unsigned operand is given one bit wider).

    On an ECP5 board (the platform's family ``ecp5``) it is one MULT18X18D that holds both
    registers itself (``REG_INPUTA``, ``REG_INPUTB``, ``REG_OUTPUT`` on ``CLK0``, always
    enabled, never reset): Yosys maps a ``$mul`` to a combinational MULT18X18D and does not
    move the flip-flops around it into the block, and the routing into and out of the block
    (4-5 ns each way) beside its 3.9 ns held ECP5 builds at 74-86 MHz. Elsewhere (simulation,
    the other families) the same two registers are in logic. The block's registers start at
    0 with its global reset disabled (``GSR``), as the logic's do.

    ``in_logic``: the logic's registers and a ``$mul`` on every platform, for a product that
    a board build makes from logic (Yosys's ``booth`` pass: ``boards/build.py``).

    Members
    -------
    a : ``In(signed(a_width))``. b : ``In(signed(b_width))``.
    p : ``Out(signed(a_width + b_width))``.
    """

    def __init__(self, a_width: int, b_width: int, in_logic: bool = False):
        if not (1 <= a_width <= 18 and 1 <= b_width <= 18):
            raise ValueError(f"RegisteredMultiplier takes operands of 1 to 18 bits, not "
                             f"{a_width} and {b_width}")
        self._in_logic = in_logic
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
            for reg in ("INPUTA", "INPUTB", "OUTPUT"):
                registers.update({f"p_REG_{reg}_CLK": "CLK0", f"p_REG_{reg}_CE": "CE0",
                                  f"p_REG_{reg}_RST": "RST0"})
            m.submodules.block = Instance(
                "MULT18X18D", **registers, p_REG_INPUTC_CLK="NONE", p_REG_PIPELINE_CLK="NONE",
                p_GSR="DISABLED", p_RESETMODE="SYNC", p_MULT_BYPASS="DISABLED",
                p_CAS_MATCH_REG="FALSE", p_SOURCEB_MODE="B_SHIFT",
                i_CLK0=ClockSignal(), i_CE0=1, i_RST0=0, i_SIGNEDA=1, i_SIGNEDB=1,
                i_SOURCEA=0, i_SOURCEB=0, **ports)
            return m
        a, b = Signal.like(self.a), Signal.like(self.b)
        m.d.sync += [a.eq(self.a), b.eq(self.b), self.p.eq(a * b)]
        return m
