"""The DMA engine: LOADX copies weight words from the external memory into the weight buffer
over the burst read port of ``hdl/extmem.py``, while the array computes; LOADP copies a page
of a paged program into the program memory the same way, and after its weights a LOADX's
parameter words into the parameter buffer; LOADA copies activation words into
the input staging buffer, and STOREA copies them from the output staging buffer over the
write port (``ArchConfig.stage_in_depth``, ``stage_out_depth``), also while the array
computes. The engine runs one transfer at a time and holds one more (a LOADA or STOREA) to
start when that one ends."""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from ..isa import EXT_WORDS_PER_PARAM, Op, ext_words_per_instruction, instruction_width
from ..memories import ExtTiming
from .extmem import ext_port
from .layouts import ActxLayout, InstrLayout, LoadxLayout, ParamLayout, instr_stream

__all__ = ["DmaEngine"]


class DmaEngine(wiring.Component):
    """Executes LOADX (:data:`hwonnx.isa.LOADX_FIELDS`), LOADP (the same layout), LOADA and
    STOREA (:data:`hwonnx.isa.ACTX_FIELDS`).

    A read (LOADX, LOADP, LOADA) dispatched in cycle ``t`` makes the first read command valid
    from ``t + 1``; every next one (``timing.burst`` words at most) is valid from the cycle after
    the one before it was taken. Each word is written into the weight or activation buffer in
    the cycle it arrives; a LOADP gathers :func:`~hwonnx.isa.ext_words_per_instruction`
    words, least significant first, and writes the instruction into the program memory in the
    cycle its last word arrives (only with ``ArchConfig.prog_page``). A LOADX with
    ``par_count`` words of parameters reads them as a second read, started in the cycle the
    engine would be free after its weights, as if dispatched then; it gathers
    :data:`~hwonnx.isa.EXT_WORDS_PER_PARAM` words into each parameter word likewise.

    A STOREA dispatched in cycle ``t`` presents its first activation address in ``t + 1``;
    the word is on the write port (``wr_valid``) from ``t + 2`` until the memory takes it,
    and each next word from two cycles after the one before was taken.

    The engine is free again from the cycle after the last word arrived or was taken
    (:class:`~hwonnx.hdl.extmem.MemoryTimeline` predicts it). A LOADA or STOREA dispatched
    while a transfer runs waits in a one-entry slot (``slot_free`` low) and starts in the
    cycle that transfer's engine is free, as if dispatched then.

    Members
    -------
    instr : ``In(instr_stream())``: a transfer to start, viewed as its op's layout; ready
        when ``idle``, a LOADA or STOREA without ``fence`` when ``slot_free``.
    idle : no transfer running or waiting. slot_free : none waiting.
    ext : ``Out(ext_port(cols * 8, timing.burst))``: the external memory.
    wgt_we, wgt_addr, wgt_data : the weight buffer's write port.
    act_we, act_waddr, act_wdata : the input staging buffer's write port (LOADA).
    act_ren, act_raddr, act_rdata : the output staging buffer's read port (STOREA; data one
        cycle after the address). Both addressed as activation words (``hdl/top.py``).
    prog_we, prog_addr, prog_data : the program memory's write port (LOADP).
    par_we, par_addr, par_data : the parameter buffer's write port (LOADX's parameters).
    """

    def __init__(self, config: ArchConfig, timing: ExtTiming):
        self._config, self._timing = config, timing
        width = config.cols * 8
        act_width, act_bits = config.rows * 8, config.act_addr_bits
        super().__init__({
            "instr": In(instr_stream()), "idle": Out(1), "slot_free": Out(1),
            "ext": Out(ext_port(width, timing.burst)),
            "wgt_we": Out(1), "wgt_addr": Out(config.wgt_addr_bits), "wgt_data": Out(width),
            "act_we": Out(1), "act_waddr": Out(act_bits), "act_wdata": Out(act_width),
            "act_ren": Out(1), "act_raddr": Out(act_bits), "act_rdata": In(act_width),
            "prog_we": Out(1), "prog_addr": Out(range(config.prog_depth)),
            "prog_data": Out(instruction_width()),
            "par_we": Out(1), "par_addr": Out(config.par_addr_bits),
            "par_data": Out(ParamLayout(config).size),
        })

    def elaborate(self, platform):
        m = Module()
        burst = self._timing.burst
        loadx, actx = LoadxLayout(), ActxLayout()
        free = Signal()              # no transfer running
        waiting = Signal(InstrLayout())
        waiting_valid = Signal()
        start = Signal()             # a transfer starts: the dispatched or the waiting one
        offered = self.instr.payload
        take = Signal()
        word = Mux(waiting_valid, waiting.as_value(), offered.as_value())
        as_loadx, as_actx = loadx(word[:loadx.size]), actx(word[:actx.size])
        slotted = offered.op.matches(Op.LOADA, Op.STOREA) & ~actx(
            offered.as_value()[:actx.size]).fence
        m.d.comb += [self.idle.eq(free & ~waiting_valid), self.slot_free.eq(~waiting_valid),
                     self.instr.ready.eq(Mux(slotted, self.slot_free, self.idle)),
                     take.eq(self.instr.valid & self.instr.ready),
                     start.eq(free & (waiting_valid | take))]
        with m.If(take & ~free):
            m.d.sync += [waiting.eq(offered), waiting_valid.eq(1)]
        with m.Elif(free):
            m.d.sync += waiting_valid.eq(0)
        # As wide as the widest count (ACTX's): words not yet asked for, not yet arrived, not
        # yet written (STOREA).
        to_ask, to_get, to_put = (Signal(ActxLayout()["count"].shape, name=n)
                                  for n in ("to_ask", "to_get", "to_put"))
        have = Signal()              # the word at ``local`` is on the activation read port
        to_act = Signal()            # the words read go to the input staging buffer
        to_prog = Signal()           # ... to the program memory (LOADP)
        to_par = Signal()            # ... to the parameter buffer (a LOADX's parameters)
        par_next = Signal()          # a LOADX's parameters are read after its weights
        par_count = Signal(LoadxLayout()["par_count"].shape)
        par_ext = Signal(LoadxLayout()["par_ext"].shape)
        par_addr = Signal(self._config.par_addr_bits)
        ext = Signal(LoadxLayout()["ext_addr"].shape)
        local = Signal(max(self._config.wgt_addr_bits, self._config.act_addr_bits,
                           self._config.prog_addr_bits, self._config.par_addr_bits))
        through = Signal()           # the running read is through
        m.d.comb += [through.eq((to_get == 0) & (to_put == 0)), free.eq(through & ~par_next),
                     self.ext.cmd_valid.eq(to_ask != 0), self.ext.cmd_addr.eq(ext),
                     self.ext.cmd_len.eq(Mux(to_ask > burst, burst, to_ask)),
                     self.wgt_we.eq(self.ext.rvalid & ~to_act & ~to_prog & ~to_par),
                     self.wgt_addr.eq(local),
                     self.wgt_data.eq(self.ext.rdata),
                     self.act_we.eq(self.ext.rvalid & to_act), self.act_waddr.eq(local),
                     self.act_wdata.eq(self.ext.rdata),
                     self.act_ren.eq(to_put != 0), self.act_raddr.eq(local),
                     self.ext.wr_valid.eq((to_put != 0) & have), self.ext.wr_addr.eq(ext),
                     self.ext.wr_data.eq(self.act_rdata)]
        step = self._gathered_words(m, local, to_prog, to_par, start)
        with m.If(start):
            with m.Switch(as_loadx.op):
                with m.Case(Op.LOADX, Op.LOADP):
                    m.d.sync += [to_ask.eq(as_loadx.count), to_get.eq(as_loadx.count),
                                 ext.eq(as_loadx.ext_addr), local.eq(as_loadx.wgt_addr),
                                 to_act.eq(0), to_prog.eq(as_loadx.op == Op.LOADP),
                                 to_par.eq(0), par_next.eq(as_loadx.par_count != 0),
                                 par_count.eq(as_loadx.par_count),
                                 par_ext.eq(as_loadx.par_ext), par_addr.eq(as_loadx.par_addr)]
                with m.Case(Op.LOADA):
                    m.d.sync += [to_ask.eq(as_actx.count), to_get.eq(as_actx.count),
                                 ext.eq(as_actx.ext_addr), local.eq(as_actx.act_addr),
                                 to_act.eq(1), to_prog.eq(0), to_par.eq(0)]
                with m.Case(Op.STOREA):
                    m.d.sync += [to_put.eq(as_actx.count), ext.eq(as_actx.ext_addr),
                                 local.eq(as_actx.act_addr), have.eq(0), to_prog.eq(0),
                                 to_par.eq(0)]
        with m.Elif(through & par_next):
            m.d.sync += [to_ask.eq(par_count), to_get.eq(par_count), ext.eq(par_ext),
                         local.eq(par_addr), to_par.eq(1), par_next.eq(0)]
        with m.Else():
            with m.If(self.ext.cmd_valid & self.ext.cmd_ready):
                m.d.sync += [to_ask.eq(to_ask - self.ext.cmd_len), ext.eq(ext + self.ext.cmd_len)]
            with m.If(self.ext.rvalid):
                m.d.sync += to_get.eq(to_get - 1)
                with m.If(step):
                    m.d.sync += local.eq(local + 1)
            with m.If(to_put != 0):
                with m.If(self.ext.wr_valid & self.ext.wr_ready):
                    m.d.sync += [to_put.eq(to_put - 1), local.eq(local + 1), ext.eq(ext + 1),
                                 have.eq(0)]
                with m.Else():
                    m.d.sync += have.eq(1)
        return m

    def _gathered_words(self, m, local, to_prog, to_par, start):
        """The LOADP and parameter paths: the words of an instruction or a parameter word are
        gathered, least significant first, and written in the cycle the last arrives. Returns
        ``step``, high when an arriving word advances the buffer address: every word, but in
        a LOADP or a LOADX's parameters only the last of each (without ``prog_page`` there is
        no LOADP and no path for it)."""
        width = len(self.ext.rdata)
        per_prog = ext_words_per_instruction(self._config.cols) if self._config.prog_page else 1
        words = max(per_prog, EXT_WORDS_PER_PARAM)
        gathered = Signal((words - 1) * width)      # the words so far, the latest on top
        part = Signal(range(words))
        last_prog = to_prog & (part == per_prog - 1)
        last_par = to_par & (part == EXT_WORDS_PER_PARAM - 1)
        step = Signal()
        whole = Cat(gathered, self.ext.rdata)

        def tail(n):            # the word of n parts ending with the one arriving
            return whole[(words - n) * width:]

        m.d.comb += [step.eq(~(to_prog | to_par) | last_prog | last_par),
                     self.prog_we.eq(self.ext.rvalid & last_prog), self.prog_addr.eq(local),
                     self.prog_data.eq(tail(per_prog)[:instruction_width()]),
                     self.par_we.eq(self.ext.rvalid & last_par), self.par_addr.eq(local),
                     self.par_data.eq(tail(EXT_WORDS_PER_PARAM))]
        with m.If(self.ext.rvalid & (to_prog | to_par)):
            m.d.sync += [gathered.eq(whole[width:]),
                         part.eq(Mux(last_prog | last_par, 0, part + 1))]
        with m.If(start):
            m.d.sync += part.eq(0)
        return step
