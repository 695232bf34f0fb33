"""The DMA engine: LOADX copies weight words from the external memory into the weight buffer
over the burst read port of ``hdl/extmem.py``, while the array computes."""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from .extmem import ExtTiming
from .layouts import InstrLayout, LoadxLayout

__all__ = ["DmaEngine"]


class DmaEngine(wiring.Component):
    """Executes LOADX (:data:`hwonnx.isa.LOADX_FIELDS`). A dispatch in cycle ``t`` makes the
    first read command valid from ``t + 1``; every next one (``timing.burst`` words at most)
    is valid from the cycle after the one before it was taken. Each word is written into the
    weight buffer in the cycle it arrives; the engine is idle again from the cycle after the
    last one (:class:`~hwonnx.hdl.extmem.MemoryTimeline` predicts it).

    Members
    -------
    dispatch, instr : start (only when ``idle``); ``instr`` is viewed as a LOADX.
    idle : no word outstanding.
    cmd_valid, cmd_ready, cmd_addr, cmd_len, rvalid, rdata : the external memory's read port.
    wgt_we, wgt_addr, wgt_data : the weight buffer's write port.
    """

    def __init__(self, config: ArchConfig, timing: ExtTiming):
        self._config, self._timing = config, timing
        width = config.cols * 8
        super().__init__({
            "dispatch": In(1), "instr": In(InstrLayout()), "idle": Out(1),
            "cmd_valid": Out(1), "cmd_ready": In(1), "cmd_addr": Out(32),
            "cmd_len": Out(range(timing.burst + 1)),
            "rvalid": In(1), "rdata": In(width),
            "wgt_we": Out(1), "wgt_addr": Out(config.wgt_addr_bits), "wgt_data": Out(width),
        })

    def elaborate(self, platform):
        m = Module()
        burst = self._timing.burst
        layout = LoadxLayout()
        view = layout(self.instr.as_value()[:layout.size])
        to_ask = Signal(16)          # words not yet asked for
        to_get = Signal(16)          # words not yet arrived
        ext = Signal(32)
        wgt = Signal(self._config.wgt_addr_bits)
        m.d.comb += [self.idle.eq(to_get == 0),
                     self.cmd_valid.eq(to_ask != 0), self.cmd_addr.eq(ext),
                     self.cmd_len.eq(Mux(to_ask > burst, burst, to_ask)),
                     self.wgt_we.eq(self.rvalid), self.wgt_addr.eq(wgt),
                     self.wgt_data.eq(self.rdata)]
        with m.If(self.dispatch):
            m.d.sync += [to_ask.eq(view.count), to_get.eq(view.count), ext.eq(view.ext_addr),
                         wgt.eq(view.wgt_addr)]
        with m.Else():
            with m.If(self.cmd_valid & self.cmd_ready):
                m.d.sync += [to_ask.eq(to_ask - self.cmd_len), ext.eq(ext + self.cmd_len)]
            with m.If(self.rvalid):
                m.d.sync += [to_get.eq(to_get - 1), wgt.eq(wgt + 1)]
        return m
