"""The LOADW engine: copies one weight tile from the weight buffer into a bank of the array."""

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from .layouts import InstrLayout

__all__ = ["WeightLoader", "load_cycles"]


def load_cycles(config: ArchConfig) -> int:
    """Cycles from a LOADW's dispatch until the loader takes the next: one per array row, and
    the dispatch cycle."""
    return config.rows + 1


class WeightLoader(wiring.Component):
    """Reads ``rows`` consecutive weight words and writes word ``r`` into array row ``r`` of
    the instruction's bank, one row per cycle, starting the cycle after dispatch.

    Row ``r`` is written in cycle ``t + 2 + r`` for a dispatch in cycle ``t``; activations
    reach row ``r`` with the same one-cycle-per-row skew, so a MATMUL dispatched after the
    LOADW never sees a stale row. ``busy`` is high for the ``rows`` read cycles.

    Members
    -------
    dispatch, instr : start loading (only when ``busy`` is 0).
    busy : reads are in progress.
    wgt_addr, wgt_en, wgt_data : weight-buffer read port.
    wload_en, wload_row, wload_bank : array weight-write controls (data is ``wgt_data``).
    """

    def __init__(self, config: ArchConfig):
        self._config = config
        super().__init__({
            "dispatch": In(1),
            "instr": In(InstrLayout()),
            "busy": Out(1),
            "wgt_addr": Out(config.wgt_addr_bits),
            "wgt_en": Out(1),
            "wload_en": Out(1),
            "wload_row": Out(range(config.rows)),
            "wload_bank": Out(1),
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
        with m.If(self.dispatch):
            m.d.sync += [self.busy.eq(1), base.eq(self.instr.wgt_addr), row.eq(0),
                         bank.eq(self.instr.bank)]
        with m.Elif(self.busy):
            m.d.sync += row.eq(row + 1)
            with m.If(row == rows - 1):
                m.d.sync += self.busy.eq(0)
        m.d.comb += [self.wgt_addr.eq(base + row), self.wgt_en.eq(self.busy)]
        m.d.sync += [self.wload_en.eq(self.busy), self.wload_row.eq(row),
                     self.wload_bank.eq(bank)]
        return m
