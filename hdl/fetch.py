"""Instruction fetch from a narrow program memory (``ArchConfig.prog_width``): each
instruction is ``fetch_words`` consecutive words, least significant word first."""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from .layouts import InstrLayout

__all__ = ["NarrowFetch", "FETCH_LATENCY"]

#: A program memory of whole instructions (``hdl/top.py``): cycles from the read of an
#: instruction into the empty instruction register (at ``start``, and at a page's first
#: instruction) until the dispatcher can take it: the read, then its capture.
FETCH_LATENCY = 2


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
    mem_addr, mem_en : ``Out``; mem_data : ``In(prog_width)``: the memory's read port (one
        cycle latency).
    """

    def __init__(self, config: ArchConfig):
        if not config.prog_width:
            raise ValueError("NarrowFetch needs an ArchConfig with prog_width set")
        self._config = config
        super().__init__({
            "start": In(1), "running": In(1), "fire": In(1),
            "instr": Out(InstrLayout()), "valid": Out(1),
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
