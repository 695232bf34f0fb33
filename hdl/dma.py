"""The DMA engine: LOADX copies weight words from the external memory into the weight buffer
over the burst read port of ``hdl/extmem.py``, while the array computes; LOADA copies
activation words into the activation buffer the same way, and STOREA copies them back over
the write port (both while every other engine is idle: ``hdl/top.py``)."""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from ..isa import Op
from .extmem import ExtTiming
from .layouts import ActxLayout, InstrLayout, LoadxLayout

__all__ = ["DmaEngine"]


class DmaEngine(wiring.Component):
    """Executes LOADX (:data:`hwonnx.isa.LOADX_FIELDS`), LOADA and STOREA
    (:data:`hwonnx.isa.ACTX_FIELDS`).

    A read (LOADX, LOADA) dispatched in cycle ``t`` makes the first read command valid from
    ``t + 1``; every next one (``timing.burst`` words at most) is valid from the cycle after
    the one before it was taken. Each word is written into the weight or activation buffer in
    the cycle it arrives.

    A STOREA dispatched in cycle ``t`` presents its first activation address in ``t + 1``;
    the word is on the write port (``wr_valid``) from ``t + 2`` until the memory takes it,
    and each next word from two cycles after the one before was taken.

    The engine is idle again from the cycle after the last word arrived or was taken
    (:class:`~hwonnx.hdl.extmem.MemoryTimeline` predicts it); ``act_busy`` is high while a
    LOADA or STOREA runs.

    Members
    -------
    dispatch, instr : start (only when ``idle``); ``instr`` is viewed as its op's layout.
    idle, act_busy : no word outstanding; an activation transfer running.
    cmd_valid, cmd_ready, cmd_addr, cmd_len, rvalid, rdata : the external memory's read port.
    wr_valid, wr_ready, wr_addr, wr_data : its write port (one word, held until ready).
    wgt_we, wgt_addr, wgt_data : the weight buffer's write port.
    act_we, act_waddr, act_wdata : the activation buffer's write port.
    act_ren, act_raddr, act_rdata : its read port (data one cycle after the address).
    """

    def __init__(self, config: ArchConfig, timing: ExtTiming):
        self._config, self._timing = config, timing
        width = config.cols * 8
        act_width, act_bits = config.rows * 8, config.act_addr_bits
        super().__init__({
            "dispatch": In(1), "instr": In(InstrLayout()), "idle": Out(1), "act_busy": Out(1),
            "cmd_valid": Out(1), "cmd_ready": In(1), "cmd_addr": Out(32),
            "cmd_len": Out(range(timing.burst + 1)),
            "rvalid": In(1), "rdata": In(width),
            "wr_valid": Out(1), "wr_ready": In(1), "wr_addr": Out(32), "wr_data": Out(width),
            "wgt_we": Out(1), "wgt_addr": Out(config.wgt_addr_bits), "wgt_data": Out(width),
            "act_we": Out(1), "act_waddr": Out(act_bits), "act_wdata": Out(act_width),
            "act_ren": Out(1), "act_raddr": Out(act_bits), "act_rdata": In(act_width),
        })

    def elaborate(self, platform):
        m = Module()
        burst = self._timing.burst
        loadx, actx = LoadxLayout(), ActxLayout()
        word = self.instr.as_value()
        as_loadx, as_actx = loadx(word[:loadx.size]), actx(word[:actx.size])
        to_ask = Signal(24)          # words not yet asked for
        to_get = Signal(24)          # words not yet arrived
        to_put = Signal(24)          # words not yet written (STOREA)
        have = Signal()              # the word at ``local`` is on the activation read port
        to_act = Signal()            # the words read go to the activation buffer
        ext = Signal(32)
        local = Signal(max(self._config.wgt_addr_bits, self._config.act_addr_bits))
        m.d.comb += [self.idle.eq((to_get == 0) & (to_put == 0)),
                     self.act_busy.eq(((to_get != 0) & to_act) | (to_put != 0)),
                     self.cmd_valid.eq(to_ask != 0), self.cmd_addr.eq(ext),
                     self.cmd_len.eq(Mux(to_ask > burst, burst, to_ask)),
                     self.wgt_we.eq(self.rvalid & ~to_act), self.wgt_addr.eq(local),
                     self.wgt_data.eq(self.rdata),
                     self.act_we.eq(self.rvalid & to_act), self.act_waddr.eq(local),
                     self.act_wdata.eq(self.rdata),
                     self.act_ren.eq(to_put != 0), self.act_raddr.eq(local),
                     self.wr_valid.eq((to_put != 0) & have), self.wr_addr.eq(ext),
                     self.wr_data.eq(self.act_rdata)]
        with m.If(self.dispatch):
            with m.Switch(as_loadx.op):
                with m.Case(Op.LOADX):
                    m.d.sync += [to_ask.eq(as_loadx.count), to_get.eq(as_loadx.count),
                                 ext.eq(as_loadx.ext_addr), local.eq(as_loadx.wgt_addr),
                                 to_act.eq(0)]
                with m.Case(Op.LOADA):
                    m.d.sync += [to_ask.eq(as_actx.count), to_get.eq(as_actx.count),
                                 ext.eq(as_actx.ext_addr), local.eq(as_actx.act_addr),
                                 to_act.eq(1)]
                with m.Case(Op.STOREA):
                    m.d.sync += [to_put.eq(as_actx.count), ext.eq(as_actx.ext_addr),
                                 local.eq(as_actx.act_addr), have.eq(0)]
        with m.Else():
            with m.If(self.cmd_valid & self.cmd_ready):
                m.d.sync += [to_ask.eq(to_ask - self.cmd_len), ext.eq(ext + self.cmd_len)]
            with m.If(self.rvalid):
                m.d.sync += [to_get.eq(to_get - 1), local.eq(local + 1)]
            with m.If(to_put != 0):
                with m.If(self.wr_valid & self.wr_ready):
                    m.d.sync += [to_put.eq(to_put - 1), local.eq(local + 1), ext.eq(ext + 1),
                                 have.eq(0)]
                with m.Else():
                    m.d.sync += have.eq(1)
        return m
