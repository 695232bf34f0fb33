"""A multiplier with its operands and its product in registers, in a DSP block's own registers
where the board's family has them."""

from amaranth.hdl import ClockSignal, Const, Instance, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["RegisteredMultiplier", "MULT_LATENCY", "PIPELINED_MULT_LATENCY", "logic_product",
           "bit_pair_sum", "ecp5_bit_pair_sum"]

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
            product = logic_product(m, a, b, middle=middle,
                                    ecp5=getattr(platform, "family", None) == "ecp5")
        elif middle:
            product = Signal.like(self.p, name="middle")
            m.d.sync += product.eq(a * b)
        else:
            product = a * b
        m.d.sync += self.p.eq(product)
        return m


def logic_product(m: Module, a, b, middle: bool = False, ecp5: bool = False):
    """``a * b`` (both signed, ``b`` of an even number of bits) as a sum of partial products
    with no ``$mul`` for a synthesis tool to put into a DSP block: ``a`` times each bit of
    ``b``, summed a pair of bits at a time (:func:`bit_pair_sum`: ``b``'s sign bit's term
    subtracted), then in a tree of adders. Each sum is a wire marked ``keep``, so that Yosys
    maps every adder to a carry chain instead of merging the tree into one ``$macc`` of plain
    gates (which took 311 LUT4 for an 8x8 product on ECP5, and Yosys's ``booth`` pass on a
    ``$mul`` 170 LUT4 and 8 CCU2C; 180 ``booth`` products in a 16x16 board top tripped an
    assertion of Yosys 0.70's ABC9 reintegration).

    ``ecp5``: the pairs' sums are carry chains of CCU2C cells that form the partial products
    themselves (:func:`ecp5_bit_pair_sum`): an 8x8 product takes 37 CCU2C (20 of them in the
    pairs' chains) and no other logic, where the same tree with the partial products in LUT4s
    took 36 CCU2C and 65 LUT4.

    ``middle``: the tree's second level of sums goes into registers (the result is a cycle
    later), so that no path runs through more than two carry chains in series."""
    n = len(b)
    if n % 2 or n < 2:
        raise ValueError(f"logic_product takes a multiplier of an even number of bits, not {n}")
    pair_sum = ecp5_bit_pair_sum if ecp5 else bit_pair_sum
    terms = [(pair_sum(m, a, b[i], b[i + 1], subtract=i + 2 == n, name=f"pair_{i // 2}"), i)
             for i in range(0, n, 2)]
    if middle and len(terms) < 3:
        raise ValueError(f"logic_product splits a tree of at least two levels, not {n} bits")
    level = 1
    while len(terms) > 1:
        summed = []
        for i in range(0, len(terms) - 1, 2):
            (low, at), (high, high_at) = terms[i], terms[i + 1]
            total = low + (high << (high_at - at))
            wire = Signal(total.shape(), name=f"partial_{level}_{i // 2}", attrs={"keep": 1})
            m.d.comb += wire.eq(total)
            summed.append((wire, at))
        terms = summed + terms[len(terms) - len(terms) % 2:]
        if middle and level == 1:
            held = [(Signal(term.shape(), name=f"middle_{i}"), at)
                    for i, (term, at) in enumerate(terms)]
            m.d.sync += [reg.eq(term) for (reg, _), (term, _) in zip(held, terms)]
            terms = held
        level += 1
    return terms[0][0]


def bit_pair_sum(m: Module, a, x_bit, y_bit, subtract: bool, name: str):
    """``a * x_bit + 2 * a * y_bit`` (``a`` signed; minus the second term with ``subtract``),
    ``len(a) + 2`` bits signed: the partial products of two neighbouring multiplier bits,
    summed."""
    x, y = Mux(x_bit, a, 0), Mux(y_bit, a, 0)
    total = (x - (y << 1)) if subtract else (x + (y << 1))
    wire = Signal(signed(len(a) + 2), name=name, attrs={"keep": 1})
    m.d.comb += wire.eq(total)
    return wire


def ecp5_bit_pair_sum(m: Module, a, x_bit, y_bit, subtract: bool, name: str):
    """:func:`bit_pair_sum` as one carry chain of ECP5 CCU2C cells, each bit's partial
    products formed in the cell's own LUT4 (Yosys's model, ``+/ecp5/ccu2c_sim.vh``): the
    propagate is ``(A & B) ^ (C & D)`` (its complement with ``subtract``), ``A & B`` the
    second term's bit (``a`` one place lower, times ``y_bit``) and ``C & D`` the first's
    (``a`` times ``x_bit``); the generate, the same LUT with C and D low, is then the second
    term's bit (its complement), which is the carry whenever the propagate is low. With
    ``subtract`` the chain adds the complement and a carry in of 1."""
    width = len(a) + 2
    sign = len(a) - 1
    out = Signal(signed(width), name=name)
    carry = Const(int(subtract), 1)

    def init(invert: bool) -> int:
        return sum(1 << i for i in range(16)
                   if ((i & 1) & (i >> 1 & 1)) ^ invert ^ ((i >> 2 & 1) & (i >> 3 & 1)))

    for j in range(0, width, 2):
        ports = {}
        for half, bit in ((0, j), (1, j + 1)):
            # The second term's bit j is a's bit j - 1 (none below bit 1): A low makes it 0.
            ports[f"i_A{half}"] = a[min(bit - 1, sign)] if bit else Const(0, 1)
            ports[f"i_B{half}"] = y_bit
            ports[f"i_C{half}"] = a[min(bit, sign)]
            ports[f"i_D{half}"] = x_bit
            ports[f"o_S{half}"] = out[bit] if bit < width else Signal(name=f"{name}_unused")
            ports[f"p_INIT{half}"] = Const(init(subtract), 16)
        cout = Signal(name=f"{name}_carry_{j // 2}")
        m.submodules[f"{name}_{j // 2}"] = Instance(
            "CCU2C", p_INJECT1_0="NO", p_INJECT1_1="NO", i_CIN=carry, o_COUT=cout, **ports)
        carry = cout
    return out
