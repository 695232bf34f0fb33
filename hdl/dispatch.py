"""The dispatcher: hands each instruction on offer to the engine that executes it, in order,
one per cycle, once the engines before it in the program have done what it depends on."""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from ..isa import Op, encode, ext_words_per_instruction
from .layouts import DecodedLayout, InstrLayout, instr_stream

__all__ = ["Dispatcher", "ACCEPT_RULES"]


#: When the dispatcher takes the instruction on offer, by opcode: the engine stream it goes
#: out on (``None``: the dispatcher keeps it) and what must hold besides that engine's
#: ``ready``. ``s`` is the status the rules read: ``decoded`` (the instruction on offer decoded,
#: :class:`~hwonnx.hdl.layouts.DecodedLayout`),
#: ``bank_free``, ``drained`` (the feeder's), ``loader_idle``, ``eltw_idle``, ``post_idle``
#: (the post-processor idle with no POST waiting in the slot) and ``all_idle`` (every engine,
#: the DMA engine too).
ACCEPT_RULES = {
    # the array side of the bank it writes is free (no MATMUL still reads it)
    Op.LOADW: ("loadw", lambda s: Mux(s.decoded.bank, s.bank_free[1], s.bank_free[0])),
    Op.MATMUL: ("matmul", lambda s: 1),
    # into the one-entry POST slot (below), once the POST before has finished, so that no
    # MATMUL after it can reach that POST's accumulator half early
    Op.POST: (None, lambda s: s.post_idle & s.eltw_idle),
    # the feeder drained (they share the activation read port and the accumulators); with
    # ``wait``, the POSTs before it done
    Op.ELTW: ("eltw", lambda s: s.drained & (~s.decoded.wait | s.post_idle)),
    Op.END: (None, lambda s: s.all_idle),
    # a fence: the words of the LOADX before are in; with parameters, once the POSTs have
    # read theirs
    Op.LOADX: ("dma", lambda s: s.loader_idle & (s.post_idle | s.decoded.no_params)),
    Op.LOADP: ("dma", lambda s: 1),
    # a transfer once the engines before it are done with its staging buffer: a LOADA's
    # readers, a STOREA's writer
    Op.LOADA: ("dma", lambda s: s.drained & s.eltw_idle),
    Op.STOREA: ("dma", lambda s: s.post_idle),
    # the tile walker's templates and loops: taken at once (``hdl/walker.py``)
    **{op: (None, lambda s: 1) for op in Op.WALKER},
}


class Dispatcher(wiring.Component):
    """Takes the instruction on ``instr`` when :data:`ACCEPT_RULES` allow it and offers it on
    its engine's stream in the same cycle. A POST waits in a one-entry slot until the MATMULs
    taken before it are done (``mm_completed`` reaches the ``mm_accepted`` of then), while
    the dispatcher goes on to the next tile's MATMULs (its accumulator half is the other
    one): the drain overlaps the next tile.

    Members
    -------
    instr : ``In(instr_stream())``: the instruction on offer (the tile walker's or the
        stored one); ``ready`` when it is taken.
    decoded : ``In(DecodedLayout())``: it decoded (:func:`~hwonnx.hdl.layouts.decoded`), from
        registers beside the instruction: the rules read these, not ``instr``'s fields.
    loadw, matmul, post, eltw : ``Out(instr_stream())``: into the weight loader, the feeder,
        the post-processor and the element-wise engine. With an external memory also
        ``dma`` (a paged program also takes ``boot``: in that cycle the DMA engine gets the
        LOADP of the program's first two pages, and nothing else is dispatched).
    bank_free, drained, mm_accepted, mm_completed : ``In``: the feeder's status.
    dma_idle : ``In(1)`` (with an external memory): no transfer running or waiting.
    post_idle : ``Out(1)``: the post-processor idle and no POST waiting.
    blocked : ``Out(1)``: an instruction is on offer that its engine cannot take yet.
    """

    def __init__(self, config: ArchConfig):
        self._config = config
        members = {"instr": In(instr_stream()), "decoded": In(DecodedLayout()),
                   "loadw": Out(instr_stream()),
                   "matmul": Out(instr_stream()), "post": Out(instr_stream()),
                   "eltw": Out(instr_stream()), "bank_free": In(2), "drained": In(1),
                   "mm_accepted": In(16), "mm_completed": In(16), "post_idle": Out(1),
                   "blocked": Out(1)}
        if config.ext_memory:
            members.update(dma=Out(instr_stream()), dma_idle=In(1), boot=In(1))
        super().__init__(members)

    def boot_word(self) -> int:
        """The LOADP a paged program starts with: its first two pages from external word 0
        into the program memory (``hwonnx.compiler.paging``)."""
        cfg = self._config
        return encode(op=Op.LOADP, count=cfg.prog_depth * ext_words_per_instruction(cfg.cols),
                      prog_addr=0, ext_addr=0)

    def elaborate(self, platform):
        m = Module()
        instr = self.instr.payload
        has_dma = bool(self._config.ext_memory)
        engines = {name: getattr(self, name) for name in ("loadw", "matmul", "eltw")
                   + (("dma",) if has_dma else ())}
        pend = Signal(InstrLayout())
        pend_valid = Signal()
        post = self.post
        dma_idle = self.dma_idle if has_dma else Const(1)
        status = SimpleNamespace(
            decoded=self.decoded, bank_free=self.bank_free, drained=self.drained,
            loader_idle=self.loadw.ready, eltw_idle=self.eltw.ready, post_idle=self.post_idle,
            all_idle=self.loadw.ready & self.drained & self.post_idle & self.eltw.ready
            & dma_idle)
        m.d.comb += self.post_idle.eq(post.ready & ~pend_valid)

        # Each engine's stream is valid when its instruction is on offer and the rest of its
        # rule holds; the offer is taken when that engine is ready too, or when the rule of an
        # instruction the dispatcher keeps holds.
        def holds(op, rule):
            return self.decoded.op[op] & rule(status)

        taken = []
        for name, stream in engines.items():
            rules = [holds(op, rule) for op, (engine, rule) in ACCEPT_RULES.items()
                     if engine == name]
            m.d.comb += [stream.payload.eq(instr),
                         stream.valid.eq(self.instr.valid & Cat(*rules).any())]
            taken.append(stream.valid & stream.ready)
        kept = [holds(op, rule) for op, (engine, rule) in ACCEPT_RULES.items() if engine is None]
        accept = Signal()
        m.d.comb += [accept.eq(Cat(*taken).any() | (self.instr.valid & Cat(*kept).any())),
                     self.instr.ready.eq(accept), self.blocked.eq(self.instr.valid & ~accept)]
        if has_dma:             # (nothing is on offer in that cycle: the program's first
            with m.If(self.boot):       # instruction is read once the LOADP is done)
                m.d.comb += [self.dma.payload.eq(self.boot_word()), self.dma.valid.eq(1)]

        # The POST slot: a POST taken starts at once if every MATMUL taken before it is
        # done, else it waits in the slot for them.
        taken_post = Signal()
        start_now, start_pending = Signal(), Signal()
        target = Signal(16)
        m.d.comb += [
            taken_post.eq(self.instr.valid & self.instr.ready & self.decoded.op[Op.POST]),
            start_now.eq(taken_post & (self.mm_completed == self.mm_accepted)),
            start_pending.eq(pend_valid & (self.mm_completed == target)),
            post.valid.eq(start_now | start_pending),
            post.payload.eq(Mux(pend_valid, pend.as_value(), instr.as_value())),
        ]
        with m.If(~pend_valid):             # taken while the slot is empty: ``valid``
            m.d.sync += [pend.eq(instr),    # drives only the slot's flag
                         target.eq(self.mm_accepted)]
        with m.If(taken_post & ~start_now):
            m.d.sync += pend_valid.eq(1)
        with m.If(start_pending):
            m.d.sync += pend_valid.eq(0)
        return m
