"""The weight-stationary systolic array."""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from .dsp import MULT_LATENCY, PIPELINED_MULT_LATENCY, RegisteredMultiplier

__all__ = ["SystolicArray", "array_latency", "logic_pes", "product_module", "psum_width",
           "product_stages"]


def product_stages(config: ArchConfig) -> int:
    """Register stages of a PE's multiply: its operands (the activation, or the depthwise one,
    and the weight of the word's bank, selected and registered), then the product, so that the
    operand selection, the multiplier and the partial sum's adder are separate
    register-to-register paths; in the pipelined datapath a register in the middle of the
    multiply too (the DSP block's pipeline register; the middle of the adder tree of a product
    made from logic, whose four carry chains in series are too long for 100 MHz on ECP5)."""
    return MULT_LATENCY if config.compact else PIPELINED_MULT_LATENCY


def product_module(row: int, col: int) -> str:
    """The name of PE ``(row, col)``'s multiplier, a submodule of the array of its own, so
    that a board build can select it by name: the PEs beyond a device's DSP blocks get their
    products from logic (``boards/build.py``)."""
    return f"pe_{row}_{col}_mul"


def logic_pes(config: ArchConfig, logic_products: int) -> "list[tuple[int, int]]":
    """The PEs whose products a board build makes from logic: the last ``logic_products`` in
    row-major order."""
    pes = [(r, c) for r in range(config.rows) for c in range(config.cols)]
    return pes[len(pes) - logic_products:] if logic_products else []


def psum_width(row: int) -> int:
    """Bits of PE row ``row``'s partial sum: the sum of ``row + 1`` products of two int8
    values, each in ``[-16256, 16384]``, needs no more (a 32-bit one in every PE took 12 to 16 more
    adder cells and flip-flops each on 16 rows: the sums are widened at the bottom)."""
    return ((row + 1) * 128 * 128).bit_length() + 1


def array_latency(config: ArchConfig) -> int:
    """Cycles from presenting an activation word on ``feed`` to its ``cols`` sums on ``sums``:
    ``rows + cols`` for the skew, the flow through the array and the partial-sum registers,
    plus :func:`product_stages`."""
    return config.rows + config.cols + product_stages(config)


class SystolicArray(wiring.Component):
    """``rows`` x ``cols`` int8 processing elements; partial sums as wide as their row needs
    (:func:`psum_width`), the column sums int32.

    PE ``(r, c)`` holds two weights (banks 0 and 1). An activation word presented on ``feed``
    is skewed so that lane ``r`` enters row ``r`` ``r`` cycles later; it then moves one PE to
    the right per cycle, carrying the bank bit that selects the weight each PE multiplies it
    with; the two operands are registered, then the product (:func:`product_stages`), and it
    is added into the partial sum in the next cycle. Partial sums move one PE down per cycle
    and are de-skewed at the bottom, so the ``cols`` dot products of one activation word
    appear together on ``sums`` exactly :func:`array_latency` cycles after the word was
    presented. Because the bank travels with
    the data, one bank can be rewritten while the other is in use: weight loads overlap
    computation. Each PE's multiplier is a :class:`~hwonnx.hdl.dsp.RegisteredMultiplier`
    (the operand registers and the product's), but for the :func:`logic_pes` of
    ``logic_products``, which a board build makes from logic: theirs stay a ``$mul``.

    Members
    -------
    feed : ``In(ArrayLayout(signed(8), rows))`` activation word, one lane per row.
    feed_bank : ``In(1)`` weight bank for the word on ``feed``.
    feed_dw : ``In(1)`` depthwise streaming for the sums of the word on ``feed``: PE
        ``(r, c)`` multiplies lane ``c`` of the word presented ``r`` cycles later (the value
        PE ``(c, 0)`` holds in that cycle) instead of lane ``r`` of this word, so column
        ``c``'s sum is ``sum_r W[r][c] * word[f + r][c]`` (columns ``c < rows``).
    wload_en, wload_row, wload_bank, wload_data : write ``cols`` weights into row
        ``wload_row`` of bank ``wload_bank`` at the next clock edge.
    sums : ``Out(ArrayLayout(signed(32), cols))`` de-skewed column sums.
    """

    def __init__(self, config: ArchConfig, logic_products: int = 0):
        self._config = config
        self._logic = set(logic_pes(config, logic_products))
        super().__init__({
            "feed": In(data.ArrayLayout(signed(8), config.rows)),
            "feed_bank": In(1),
            "feed_dw": In(1),
            "wload_en": In(1),
            "wload_row": In(range(config.rows)),
            "wload_bank": In(1),
            "wload_data": In(data.ArrayLayout(signed(8), config.cols)),
            "sums": Out(data.ArrayLayout(signed(32), config.cols)),
        })

    @property
    def config(self) -> ArchConfig:
        return self._config

    def elaborate(self, platform):
        m = Module()
        rows, cols = self.config.rows, self.config.cols

        # Input skew: lane r waits r cycles before entering row r (with its bank and mode).
        row_in, bank_in, dw_in = [], [], []
        for r in range(rows):
            act, bank, dw = self.feed[r], self.feed_bank, self.feed_dw
            for stage in range(r):
                act_d = Signal(signed(8), name=f"skew_{r}_{stage}")
                bank_d = Signal(name=f"skew_bank_{r}_{stage}")
                dw_d = Signal(name=f"skew_dw_{r}_{stage}")
                m.d.sync += [act_d.eq(act), bank_d.eq(bank), dw_d.eq(dw)]
                act, bank, dw = act_d, bank_d, dw_d
            row_in.append(act)
            bank_in.append(bank)
            dw_in.append(dw)

        # Registers of each PE: activation, bank and mode move one PE to the right per cycle.
        acts = [[Signal(signed(8), name=f"pe_{r}_{c}_act") for c in range(cols)]
                for r in range(rows)]
        psum_above = [None] * cols
        for r in range(rows):
            act_left, bank_left, dw_left = row_in[r], bank_in[r], dw_in[r]
            for c in range(cols):
                act = acts[r][c]
                bank = Signal(name=f"pe_{r}_{c}_bank")
                dw = Signal(name=f"pe_{r}_{c}_dw")
                w0 = Signal(signed(8), name=f"pe_{r}_{c}_w0")
                w1 = Signal(signed(8), name=f"pe_{r}_{c}_w1")
                psum = Signal(signed(psum_width(r)), name=f"pe_{r}_{c}_psum")
                m.d.sync += [act.eq(act_left), bank.eq(bank_left), dw.eq(dw_left)]
                # Depthwise streaming: lane c of a later word, held by PE (c, 0) now.
                operand = Mux(dw, acts[c][0], act) if c < rows and (r or c) else act
                # Stage 1: the operands into registers (the weight is read in the cycle the
                # activation is in this PE). Stage 2 (and 3 when pipelined): multiply into the
                # product register (all in a DSP block's own registers on ECP5: hdl/dsp.py).
                # Then add it into the partial sum, in the cycle the partial sum of the same
                # word arrives from above.
                mul = RegisteredMultiplier(8, 8, in_logic=(r, c) in self._logic,
                                           latency=product_stages(self.config))
                m.submodules[product_module(r, c)] = mul
                m.d.comb += [mul.a.eq(operand), mul.b.eq(Mux(bank, w1, w0))]
                product = mul.p
                m.d.sync += psum.eq(product if psum_above[c] is None
                                    else psum_above[c] + product)
                with m.If(self.wload_en & (self.wload_row == r)):
                    with m.If(self.wload_bank):
                        m.d.sync += w1.eq(self.wload_data[c])
                    with m.Else():
                        m.d.sync += w0.eq(self.wload_data[c])
                psum_above[c] = psum
                act_left, bank_left, dw_left = act, bank, dw

        # Output de-skew: column c is cols - 1 - c cycles early relative to the last column.
        for c in range(cols):
            value = psum_above[c]
            for stage in range(cols - 1 - c):
                value_d = Signal(signed(psum_width(rows - 1)), name=f"deskew_{c}_{stage}")
                m.d.sync += value_d.eq(value)
                value = value_d
            m.d.comb += self.sums[c].eq(value)
        return m
