"""The LOADW engine: copies one weight tile from the weight buffer into a bank of the array,
unpacking low-bit weights on the way."""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from .banks import BANKED_READ_LATENCY
from .layouts import buffer_read, instr_stream

__all__ = ["WeightLoader", "load_cycles", "WEIGHT_PACKINGS", "tile_words", "write_delay",
           "address_lead"]


def write_delay(config: ArchConfig) -> int:
    """Cycles from the read of a weight word (the cycle the loader's row counter names it) to
    the write of its row into the array: the weight buffer's read, then the word in a
    register. In banks the read takes :data:`~hwonnx.hdl.banks.BANKED_READ_LATENCY` cycles
    from the address, which the loader presents one cycle (:func:`address_lead`) ahead; the
    single memory of the smallest devices (``compact``) takes one."""
    return 1 + (1 if config.compact else BANKED_READ_LATENCY - address_lead(config))


def address_lead(config: ArchConfig) -> int:
    """Cycles by which the loader presents a read's address before the cycle of the read: one
    to the banked buffer, which registers it (``hdl/banks.py``), none to a single memory."""
    return 0 if config.compact else 1


#: The packings the loader unpacks. With ``wpack`` p, lane ``c`` of weight word ``w`` of a tile
#: holds the column-``c`` weights of array rows ``w * 2**p`` to ``w * 2**p + 2**p - 1``, each
#: in ``8 >> p`` bits of two's complement, the first row in the least significant bits: 8-bit
#: weights one per byte, 4-bit two, 2-bit (and bipolar, as -1 and 1) four.
WEIGHT_PACKINGS = (0, 1, 2)


def load_cycles(config: ArchConfig) -> int:
    """Cycles from a LOADW's dispatch until the loader takes the next: one per array row, and
    the dispatch cycle (the same for every packing)."""
    return config.rows + 1


def tile_words(config: ArchConfig, wpack: int) -> int:
    """Weight words of one tile with packing ``wpack``."""
    per = 1 << wpack
    return (config.rows + per - 1) // per


class WeightLoader(wiring.Component):
    """Reads a tile's weight words and writes array row ``r`` of the instruction's bank, one
    row per cycle, starting the cycle after dispatch, from word ``wgt_addr + (r >> wpack)``.

    Row ``r`` is written in cycle ``t + 1 + write_delay + r`` (``t + 4 + r``, compact
    ``t + 3 + r``) for a dispatch in cycle ``t``; activations reach row ``r`` with the same
    one-cycle-per-row skew, so a MATMUL dispatched after the LOADW (its first word reaches row
    ``r`` in ``t + 2 + feed_delay + r`` at the earliest, and ``feed_delay`` is
    ``write_delay``) never sees a stale row. ``busy`` is high for the ``rows`` read cycles. A
    packed word is read once per row it holds (``rows`` reads whatever the packing): the
    timing stays that of 8-bit weights, and only the memory shrinks.

    Members
    -------
    instr : ``In(instr_stream())``: a LOADW to start (ready when ``busy`` is 0).
    busy : reads are in progress.
    free_next : ``busy`` is 0 in the next cycle unless a LOADW is taken in this one (not busy,
        or in the last read cycle), from a register: the dispatcher hands the next LOADW over
        in the last read cycle, so that its hand-off register costs no cycle between
        back-to-back LOADWs (``hdl/dispatch.py``).
    wgt : ``Out(buffer_read(wgt_depth, ArrayLayout(signed(8), cols)))``: the weight buffer's
        read port, its address :func:`address_lead` cycles ahead of the read (``en`` too).
    wload_en, wload_row, wload_bank, wload_data : array weight-write controls and the
        unpacked row.
    """

    def __init__(self, config: ArchConfig):
        self._config = config
        super().__init__({
            "instr": In(instr_stream()),
            "busy": Out(1), "free_next": Out(1),
            "wgt": Out(buffer_read(config.wgt_depth, data.ArrayLayout(signed(8), config.cols))),
            "wload_en": Out(1),
            "wload_row": Out(range(config.rows)),
            "wload_bank": Out(1),
            "wload_data": Out(data.ArrayLayout(signed(8), config.cols)),
        })

    @property
    def config(self) -> ArchConfig:
        return self._config

    def elaborate(self, platform):
        m = Module()
        rows = self.config.rows
        base = Signal(self.config.wgt_addr_bits)
        row = Signal(range(rows))
        bank = Signal()
        wpack = Signal(2)
        # The instruction's fields are taken in every cycle the loader is ready (see
        # ``instr_stream``).
        instr = self.instr.payload
        m.d.comb += self.instr.ready.eq(~self.busy)
        with m.If(~self.busy):
            m.d.sync += [base.eq(instr.wgt_addr), row.eq(0), bank.eq(instr.bank),
                         wpack.eq(instr.wpack)]
        last = Signal()         # the last read cycle (``row`` is ``rows - 1``)
        m.d.comb += self.free_next.eq(~self.busy | last)
        with m.If(self.instr.valid & self.instr.ready):
            m.d.sync += [self.busy.eq(1), last.eq(rows == 1)]
        with m.Elif(self.busy):
            m.d.sync += [row.eq(row + 1), last.eq(row == rows - 2)]
            with m.If(row == rows - 1):
                m.d.sync += self.busy.eq(0)
        # The word of row r is read in the cycle ``row`` is r; its address is presented
        # address_lead cycles before. One cycle ahead, the next read is row + 1's, or, in a
        # cycle the loader is ready, the instruction's first word (it is dispatched then, or
        # nothing is read).
        lead = address_lead(self.config)
        offset = Signal.like(row)
        with m.Switch(wpack):
            for p in WEIGHT_PACKINGS:
                with m.Case(p):
                    m.d.comb += offset.eq((row + lead) >> p)
        if lead:
            m.d.comb += [self.wgt.addr.eq(Mux(self.busy, base + offset, instr.wgt_addr)),
                         self.wgt.en.eq(Mux(self.busy, row != rows - 1, self.instr.valid))]
        else:
            m.d.comb += [self.wgt.addr.eq(base + offset), self.wgt.en.eq(self.busy)]
        # The word read in cycle k is on wgt_data in k + write_delay - 1 and then in a
        # register: the buffer's output drives only that register, not the unpacking and the
        # wires to every PE of the array. The row, bank and slot of the read follow it.
        word = Signal(self.config.cols * 8)
        m.d.sync += word.eq(self.wgt.data.as_value())
        follow = [(self.busy, self.wload_en), (row, self.wload_row), (bank, self.wload_bank)]
        slot, unpack = Signal(2), Signal(2)
        follow += [(row, slot), (wpack, unpack)]
        for source, target in follow:
            value = source
            for stage in range(write_delay(self.config) - 1):
                delayed = Signal.like(target, name=f"{target.name}_d{stage}")
                m.d.sync += delayed.eq(value)
                value = delayed
            m.d.sync += target.eq(value)
        # Unpack the word in the register: the slot of the row read write_delay cycles before.
        for c in range(self.config.cols):
            byte = word[8 * c:8 * c + 8]
            with m.Switch(unpack):
                for p in WEIGHT_PACKINGS:
                    bits = 8 >> p
                    with m.Case(p):
                        field = byte.bit_select(slot[:p] * bits, bits) if p else byte
                        m.d.comb += self.wload_data[c].eq(field.as_signed())
        return m
