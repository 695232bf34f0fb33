"""The dispatcher: hands each instruction on offer to the engine that executes it, in order,
one per cycle, once the engines before it in the program have done what it depends on."""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from ..isa import Op, encode, ext_words_per_instruction
from .layouts import DecodedLayout, InstrLayout, instr_stream

__all__ = ["Dispatcher", "ACCEPT_RULES", "handoff_latency"]


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


def handoff_latency(config: ArchConfig) -> int:
    """Cycles from the dispatcher taking an instruction to its engine taking it: the hand-off
    registers between them (:class:`Dispatcher`); none in the compact datapath (the UP5K has
    no logic cells to spare for them). ``compiler/timing.py`` starts every engine this many
    cycles after the dispatch."""
    return 0 if config.compact else 1


class Dispatcher(wiring.Component):
    """Takes the instruction on ``instr`` when :data:`ACCEPT_RULES` allow it and hands it to
    its engine :func:`handoff_latency` cycles later, through registers: the decision
    (``accept``) drives only the engines' ``valid`` flip-flops, the tile walker's and the
    fetch queue's pointers, never an engine's state (the loop from the offer through
    ``accept`` into the engines was the critical path of every ULX3S-85F build from 82 to
    92 MHz). While an instruction is in an engine's hand-off register, the statuses the
    rules read count that engine busy. A POST waits in a one-entry slot until the MATMULs
    taken before it are done (``mm_completed`` reaches the count of MATMULs taken until
    then), while the dispatcher goes on to the next tile's MATMULs (its accumulator half is
    the other one): the drain overlaps the next tile.

    Members
    -------
    instr : ``In(instr_stream())``: the instruction on offer (the tile walker's or the
        stored one); ``ready`` when it is taken.
    decoded : ``In(DecodedLayout())``: it decoded (:func:`~hwonnx.hdl.layouts.decoded`), from
        registers beside the instruction: the rules read these, not ``instr``'s fields.
    loadw, matmul, post, eltw : ``Out(instr_stream())``: into the weight loader, the feeder,
        the post-processor and the element-wise engine; each engine is ready whenever its
        ``valid`` is high (the rules waited for it). With an external memory also ``dma`` (a
        paged program also takes ``boot``: in that cycle the DMA engine's LOADP of the
        program's first two pages is taken, and nothing else).
    bank_free, drained, mm_completed : ``In``: the feeder's status.
    loadw_free_next : ``In(1)``: the weight loader's ``free_next``: with the hand-off, a LOADW
        goes when the loader is free in the next cycle, when the hand-off register gives it
        over (the fence and END still wait for the loader idle).
    dma_idle, dma_slot_free : ``In(1)`` (with an external memory): no transfer running or
        waiting; its slot for a LOADA or STOREA empty (``hdl/dma.py``).
    post_idle : ``Out(1)``: the post-processor idle, no POST waiting or handed over.
    posts_done : ``Out(1)``: for the feeder's MATMUL with ``wait``: the post-processor idle,
        no POST handed over, and the POST in the slot (if any) taken after the MATMUL in
        the feeder's slot (a POST taken after it waits for it: counting that one too, as
        ``post_idle`` does, would hold both forever).
    blocked : ``Out(1)``: an instruction is on offer that its engine cannot take yet.
    """

    def __init__(self, config: ArchConfig):
        self._config = config
        members = {"instr": In(instr_stream()), "decoded": In(DecodedLayout()),
                   "loadw": Out(instr_stream()),
                   "matmul": Out(instr_stream()), "post": Out(instr_stream()),
                   "eltw": Out(instr_stream()), "bank_free": In(2), "drained": In(1),
                   "loadw_free_next": In(1),
                   "mm_completed": In(16), "post_idle": Out(1), "posts_done": Out(1),
                   "blocked": Out(1)}
        if config.ext_memory:
            members.update(dma=Out(instr_stream()), dma_idle=In(1), dma_slot_free=In(1),
                           boot=In(1))
        super().__init__(members)

    def boot_word(self) -> int:
        """The LOADP a paged program starts with: its first two pages from external word 0
        into the program memory (``hwonnx.compiler.paging``)."""
        cfg = self._config
        return encode(op=Op.LOADP, count=cfg.prog_depth * ext_words_per_instruction(cfg.cols),
                      prog_addr=0, ext_addr=0)

    def elaborate(self, platform):
        m = Module()
        instr, decoded = self.instr.payload, self.decoded
        has_dma = bool(self._config.ext_memory)
        handoff = handoff_latency(self._config)
        names = ("loadw", "matmul", "eltw") + (("dma",) if has_dma else ())
        # ``go``: the dispatcher hands the instruction on offer to that engine in this cycle;
        # ``held``: the engine's hand-off register holds one (it takes it in this cycle).
        go = {name: Signal(name=f"{name}_go") for name in names + ("post",)}
        held = {name: Signal(name=f"{name}_held") if handoff else Const(0)
                for name in names + ("post",)}
        sent = dict(go)         # what the engines get: with ``boot``, the DMA engine the LOADP
        if has_dma:             # (nothing is on offer in that cycle: the program's first
            sent["dma"] = go["dma"] | self.boot     # is read once the LOADP is done)
        if handoff:
            m.d.sync += [held[name].eq(sent[name]) for name in sent]
        pend = Signal(InstrLayout())
        pend_valid = Signal()
        accepted = Signal(16)                   # MATMULs taken (modulo 2**16)
        matmul_bank = Signal()                  # the held MATMUL's bank
        ready = {name: getattr(self, name).ready & ~held[name] for name in names}
        loader_idle = ready["loadw"]
        if handoff:
            ready["loadw"] = self.loadw_free_next & ~held["loadw"]
        if has_dma:         # the DMA engine's ``ready`` for the instruction on offer
            ready["dma"] = Mux(decoded.slotted, self.dma_slot_free, self.dma_idle) & ~held["dma"]
        busy_bank = Cat(held["matmul"] & ~matmul_bank, held["matmul"] & matmul_bank)
        status = SimpleNamespace(
            decoded=decoded, bank_free=self.bank_free & ~busy_bank,
            drained=self.drained & ~held["matmul"],
            loader_idle=loader_idle, eltw_idle=ready["eltw"], post_idle=self.post_idle,
            all_idle=loader_idle & self.drained & ~held["matmul"] & self.post_idle
            & ready["eltw"] & (self.dma_idle & ~held["dma"] if has_dma else 1))
        m.d.comb += self.post_idle.eq(self.post.ready & ~pend_valid & ~held["post"])

        # Each engine's ``go`` when its instruction is on offer, the rest of its rule holds
        # and it is ready; the offer is taken then, or when the rule of an instruction the
        # dispatcher keeps holds.
        def holds(op, rule):
            return decoded.op[op] & rule(status)

        for name in names:
            rules = [holds(op, rule) for op, (engine, rule) in ACCEPT_RULES.items()
                     if engine == name]
            m.d.comb += go[name].eq(self.instr.valid & Cat(*rules).any() & ready[name])
        kept = [holds(op, rule) for op, (engine, rule) in ACCEPT_RULES.items() if engine is None]
        accept = Signal()
        m.d.comb += [accept.eq(Cat(*(go[name] for name in names)).any()
                               | (self.instr.valid & Cat(*kept).any())),
                     self.instr.ready.eq(accept), self.blocked.eq(self.instr.valid & ~accept)]
        with m.If(go["matmul"]):
            m.d.sync += accepted.eq(accepted + 1)

        # The POST slot: a POST taken starts at once if every MATMUL taken before it is
        # done, else it waits in the slot for them.
        taken_post = Signal()
        start_now, start_pending = Signal(), Signal()
        target = Signal(16)
        m.d.comb += [
            taken_post.eq(self.instr.valid & accept & decoded.op[Op.POST]),
            start_now.eq(taken_post & (self.mm_completed == accepted)),
            start_pending.eq(pend_valid & (self.mm_completed == target)),
            go["post"].eq(start_now | start_pending),
        ]
        with m.If(~pend_valid):             # taken while the slot is empty: ``valid``
            m.d.sync += [pend.eq(instr),    # drives only the slot's flag
                         target.eq(accepted)]
        with m.If(taken_post & ~start_now):
            m.d.sync += pend_valid.eq(1)
        with m.If(start_pending):
            m.d.sync += pend_valid.eq(0)
        # ``older``: the slot's POST was taken before the MATMUL in the feeder's slot, set as
        # that MATMUL reaches the feeder (with the hand-off, from ``before``: the same for the
        # cycle before, when it was dispatched); the POST leaving the slot clears it.
        older = Signal()
        if handoff:
            before = Signal()
            m.d.sync += before.eq(pend_valid & ~start_pending)
            arriving, became = held["matmul"], before & ~start_pending
        else:
            arriving, became = go["matmul"], pend_valid & ~start_pending
        with m.If(arriving):
            m.d.sync += older.eq(became)
        with m.Elif(start_pending):
            m.d.sync += older.eq(0)
        m.d.comb += self.posts_done.eq(self.post.ready & ~held["post"] & ~older)

        # The streams: with the hand-off, every engine's payload from one register loaded in
        # every cycle (the instruction of the cycle before; the boot LOADP), the POST's from
        # one of its own (the slot's or the one on offer), and ``valid`` from ``held``.
        to_engines = instr.as_value()
        if has_dma:
            to_engines = Mux(self.boot, self.boot_word(), to_engines)
        to_post = Mux(pend_valid, pend.as_value(), instr.as_value())
        if handoff:
            handed, handed_post = Signal(InstrLayout()), Signal(InstrLayout())
            m.d.sync += [handed.eq(to_engines), handed_post.eq(to_post)]
            m.d.comb += matmul_bank.eq(handed.bank)
            to_engines, to_post = handed.as_value(), handed_post.as_value()
        valid = held if handoff else sent
        for name in names:
            m.d.comb += [getattr(self, name).payload.eq(to_engines),
                         getattr(self, name).valid.eq(valid[name])]
        m.d.comb += [self.post.payload.eq(to_post), self.post.valid.eq(valid["post"])]
        return m
