"""Instruction fetch: from a program memory of whole instructions (:class:`WideFetch`), or
from a narrow one (``ArchConfig.prog_width``) where each instruction is ``fetch_words``
consecutive words, least significant word first (:class:`NarrowFetch`)."""

from amaranth.hdl import Cat, Const, Module, Mux, ResetInserter, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from .bram import buffer_read_latency
from .layouts import DecodedLayout, InstrLayout, buffer_read, decoded, instr_stream

__all__ = ["WideFetch", "NarrowFetch", "fetch_latency", "fetch_queue"]


def fetch_latency(config: ArchConfig) -> int:
    """A program memory of whole instructions: cycles from the read of an instruction into
    the empty queue (at ``start``, and at a page's first instruction) until the dispatcher can
    take it: the read (:func:`buffer_read_latency`), then its capture."""
    return buffer_read_latency(config) + 1


def fetch_queue(config: ArchConfig) -> int:
    """Instructions :class:`WideFetch` holds read ahead: with reads decided a cycle late (from
    the queue's registered fill level, never from the dispatcher's decision in the same
    cycle), one more than the reads in flight keeps one instruction per cycle flowing."""
    return buffer_read_latency(config) + 2


class WideFetch(wiring.Component):
    """Reads a program memory of whole instructions ahead into a queue of
    :func:`fetch_queue` that the dispatcher takes from, one per cycle.

    A read is issued whenever the queue has room for it counting the read in flight; the
    decision uses the queue's fill level of this cycle (a register), so the dispatcher's
    decision drives only the queue's read pointer and level, not the memory's address nor a
    wide register's enable (on a ULX3S-85F the fetch's 420-bit instruction register enabled
    by that decision, and the memory's address chosen by it, were a long path). The queue
    never runs dry once filled: an instruction is on offer in every cycle after the first
    :func:`fetch_latency`, as with one instruction register, so the cycle model
    (``hwonnx/compiler/timing.py``) is the same.

    ``start`` restarts from instruction 0, emptying the queue. With a paged program
    (``ArchConfig.prog_page``) the reads stop at the end of each page; the next page's first
    instruction is read once every instruction of the page has been taken and ``fresh``
    holds (the LOADP that wrote it is done), also at ``start``.

    Members
    -------
    start, running, fresh : ``In(1)``.
    instr : ``Out(instr_stream())``: the instruction on offer (valid while ``running``);
        taken with ``ready``.
    decoded : ``Out(DecodedLayout())``: it decoded (:func:`~hwonnx.hdl.layouts.decoded`), kept
        in registers beside the queue (decoded as the word is written into it).
    prog : ``Out(buffer_read(prog_depth, InstrLayout()))``: the program memory's read port,
        its word :func:`buffer_read_latency` cycles after the address (the block RAM's
        output drives the queue and the decode from a register: from the block RAM's output
        into the decoded registers was the 93.25 MHz ULX3S-85F build's critical path,
        10.72 ns).
    """

    def __init__(self, config: ArchConfig):
        self._config = config
        super().__init__({
            "start": In(1), "running": In(1), "fresh": In(1),
            "instr": Out(instr_stream()), "decoded": Out(DecodedLayout()),
            "prog": Out(buffer_read(config.prog_depth, InstrLayout())),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        page = cfg.prog_page
        depth, flight = fetch_queue(cfg), buffer_read_latency(cfg)
        queue = SyncFIFO(width=InstrLayout().size, depth=depth)
        m.submodules.queue = ResetInserter(self.start)(queue)
        ptr = Signal(range(cfg.prog_depth))     # the next instruction to read
        # The reads in flight, the oldest last: its word is on the port.
        flying = [Signal(name=f"arriving_{i}") for i in range(flight)]
        arriving = flying[-1]
        in_flight = sum(flying)
        waiting = Signal()                      # paged: at a page's end (or start)
        read = Signal()
        page_last = (ptr[:page.bit_length() - 1] == page - 1) if page else Const(0)
        m.d.comb += [
            read.eq(Mux(waiting, (queue.level == 0) & (in_flight == 0) & self.fresh,
                        queue.level + in_flight < depth)),
            self.prog.addr.eq(Mux(self.start, 0, ptr)),
            self.prog.en.eq(1),
            queue.w_data.eq(self.prog.data.as_value()), queue.w_en.eq(arriving),
            self.instr.payload.eq(queue.r_data),
            queue.r_en.eq(self.instr.valid & self.instr.ready),
        ]
        # The queue's words decoded, in registers beside it, the head's in ``flags[0]`` (a pop
        # shifts them, a word arriving is decoded into the entry after the last), and
        # ``queue.r_rdy`` in a register of its own (``nonempty``): the offer's ``decoded`` and
        # ``valid`` come from flip-flops, not through the queue's read multiplexer (the read
        # pointer -> head op -> the dispatcher's accept was the 89.45 MHz ULX3S-85F build's
        # critical path).
        flags = [Signal(DecodedLayout(), name=f"queued_{i}_decoded") for i in range(depth)]
        nonempty = Signal()
        push, pop = Signal(), Signal()
        m.d.comb += [push.eq(arriving & queue.w_rdy), pop.eq(queue.r_en & queue.r_rdy),
                     self.decoded.eq(flags[0]), self.instr.valid.eq(nonempty & self.running)]
        for i, entry in enumerate(flags):
            with m.If(push & (queue.level - pop == i)):
                m.d.sync += entry.eq(decoded(self.prog.data))
            with m.Elif(pop):
                m.d.sync += entry.eq(flags[i + 1] if i + 1 < len(flags) else 0)
        m.d.sync += nonempty.eq(push | Mux(pop, queue.level >= 2, nonempty))
        # fetch_latency: the read in one cycle (at start, of instruction 0), on the port
        # buffer_read_latency later, captured then; on offer in the cycle after.
        with m.If(self.start):
            m.d.sync += [ptr.eq(0 if page else 1), flying[0].eq(not page),
                         waiting.eq(bool(page)), nonempty.eq(0)]
            m.d.sync += [later.eq(0) for later in flying[1:]]
        with m.Else():
            m.d.sync += flying[0].eq(read)
            m.d.sync += [later.eq(earlier) for earlier, later in zip(flying, flying[1:])]
            with m.If(read):
                m.d.sync += [ptr.eq(ptr + 1), waiting.eq(page_last)]  # paged: 2 * prog_page,
        return m                                                          # so it wraps


class NarrowFetch(wiring.Component):
    """Reads one program word per cycle into the instruction register and hands whole
    instructions to the dispatcher.

    A word requested in cycle ``c`` is captured in ``c + 1``; the register is full (``valid``)
    in the cycle after its last capture. The next instruction's requests start in the cycle
    the dispatcher takes this one (``fire``), so instructions leave at most one per
    ``fetch_words + 1`` cycles. There is no prefetch register: it would double the flip-flops
    of the one part of the design that is not shared by every board, and a board with a
    narrow program memory is one that is short of logic. ``hwonnx/compiler/timing.py``
    models exactly these rules.

    Members
    -------
    start : ``In(1)``: restart from word 0 (discarding what is in flight).
    running : ``In(1)``: fetch only while the program runs (the host owns the memory's single
        port otherwise).
    fire : ``In(1)``: the dispatcher takes ``instr`` in this cycle.
    instr : ``Out(InstrLayout())``. valid : ``Out(1)``.
    decoded : ``Out(DecodedLayout())``: ``instr`` decoded (from the register: the boards with a
        narrow program memory are small and slow).
    mem_addr, mem_en : ``Out``; mem_data : ``In(prog_width)``: the memory's read port (one
        cycle latency).
    """

    def __init__(self, config: ArchConfig):
        if not config.prog_width:
            raise ValueError("NarrowFetch needs an ArchConfig with prog_width set")
        self._config = config
        super().__init__({
            "start": In(1), "running": In(1), "fire": In(1),
            "instr": Out(InstrLayout()), "valid": Out(1), "decoded": Out(DecodedLayout()),
            "mem_addr": Out(range(config.prog_words)), "mem_en": Out(1),
            "mem_data": In(config.prog_width),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        words, width = cfg.fetch_words, cfg.prog_width
        ptr = Signal(range(cfg.prog_words + 1))     # next word to request
        requested = Signal(range(words + 1))        # words requested for the next instruction
        captured = Signal(range(words))
        arriving = Signal()                         # a requested word is on mem_data
        buffer = Signal(words * width)
        request = Signal()
        m.d.comb += [
            request.eq(self.running & (~self.valid | self.fire) & (requested != words)),
            self.mem_addr.eq(ptr), self.mem_en.eq(request),
            self.instr.eq(buffer[:len(self.instr.as_value())]),
            self.decoded.eq(decoded(self.instr)),
        ]
        m.d.sync += arriving.eq(request)
        with m.If(request):
            m.d.sync += [ptr.eq(ptr + 1), requested.eq(requested + 1)]
        with m.If(self.fire):
            m.d.sync += self.valid.eq(0)
        with m.If(arriving):
            m.d.sync += [buffer.eq(Cat(buffer[width:], self.mem_data)), captured.eq(captured + 1)]
            with m.If(captured == words - 1):
                m.d.sync += [self.valid.eq(1), captured.eq(0), requested.eq(0)]
        with m.If(self.start):
            m.d.sync += [ptr.eq(0), requested.eq(0), captured.eq(0), arriving.eq(0),
                         self.valid.eq(0)]
        return m
