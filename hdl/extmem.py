"""External memory: the port the DMA engine drives (``hdl/dma.py``, :func:`ext_port`) and a
deterministic model of a board's memory behind it for simulation, with the timing of
``hwonnx/memories.py``.

The port, in words of ``cols`` bytes (a weight word):

- ``cmd_valid``, ``cmd_ready``, ``cmd_addr``, ``cmd_len``: a read of ``cmd_len`` words
  (1 to the burst length) from word ``cmd_addr``, taken in a cycle where both are high;
- ``rvalid``, ``rdata``: the words of the reads taken, in order, one per cycle where
  ``rvalid`` is high;
- ``wr_valid``, ``wr_ready``, ``wr_addr``, ``wr_data``: a write of one word, held until it is
  taken in a cycle where both are high.

The memory moves ``bus_bytes`` per cycle, so a word of ``W`` bytes takes ``beats =
ceil(W / bus_bytes)`` cycles. The model (:class:`ExternalMemory`) serves one read at a time: a
read taken in cycle ``c`` returns word ``i`` in cycle ``c + latency - 1 + (i + 1) * beats``
and the next read can be taken in cycle ``c + latency + len * beats``; a write taken in cycle
``c`` holds the bus until ``c + beats`` (an SDRAM write has no CAS latency). Every
``refresh_period`` cycles after ``restart`` a refresh falls due;
the memory refreshes for ``refresh_cycles`` cycles as soon as no read or write is in flight
(before any new one), taking none meanwhile. :class:`MemoryTimeline` is the same rules in
Python, for the cycle model.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..memories import ExtTiming

__all__ = ["ExternalMemory", "MemoryTimeline", "ext_port"]


def ext_port(width: int, burst: int) -> wiring.Signature:
    """The external memory's port as its user sees it (the DMA engine, the accelerator, the
    host bridge; the memory's side is its ``flip()``): reads of ``cmd_len`` words (at most
    ``burst``) from word ``cmd_addr``, taken when ``cmd_valid`` and ``cmd_ready``, whose
    words arrive in order on ``rdata`` in the cycles ``rvalid`` is high; and writes of one
    ``width``-bit word, ``wr_*`` held until ``wr_ready``."""
    return wiring.Signature({
        "cmd_valid": Out(1), "cmd_ready": In(1), "cmd_addr": Out(32),
        "cmd_len": Out(range(burst + 1)), "rvalid": In(1), "rdata": In(width),
        "wr_valid": Out(1), "wr_ready": In(1), "wr_addr": Out(32), "wr_data": Out(width)})


class ExternalMemory(wiring.Component):
    """A deterministic model of an external memory of ``depth`` words of ``width`` bits with
    ``timing`` (see the module docstring), for simulation harnesses.

    Members
    -------
    restart : ``In(1)``: the refresh schedule starts over, and a refresh under way ends
        (pulsed with the accelerator's ``start``, so that every run of a program takes the
        same cycles: a refresh that fell due in the host's writes before a run could
        otherwise hold the first read of the run).
    port : ``In(ext_port(width, timing.burst))``: the reads and writes.
    load_we, load_addr, load_data : write a word at once (the harness loads the image and
        graph inputs; never in the same cycle as a write through the port).
    dump_addr, dump_data : read a word at once, ``dump_data`` the cycle after ``dump_addr``
        (the harness reads graph outputs after a run).
    """

    def __init__(self, depth: int, width: int, timing: ExtTiming):
        self._depth, self._timing = depth, timing
        self._beats = timing.beats(-(-width // 8))
        super().__init__({
            "restart": In(1),
            "port": In(ext_port(width, timing.burst)),
            "load_we": In(1), "load_addr": In(range(depth)), "load_data": In(width),
            "dump_addr": In(range(depth)), "dump_data": Out(width),
        })

    def elaborate(self, platform):
        m = Module()
        t = self._timing
        mem = Memory(shape=len(self.port.rdata), depth=self._depth, init=[])
        m.submodules.mem = mem
        load = mem.write_port()
        read = mem.read_port()
        dump = mem.read_port()
        m.d.comb += [dump.addr.eq(self.dump_addr), self.dump_data.eq(dump.data)]
        written = self.port.wr_valid & self.port.wr_ready
        m.d.comb += [load.en.eq(self.load_we | written),
                     load.addr.eq(Mux(written, self.port.wr_addr, self.load_addr)),
                     load.data.eq(Mux(written, self.port.wr_data, self.load_data)),
                     self.port.rdata.eq(read.data)]

        tick = Signal(range(t.refresh_period))
        due = Signal()
        with m.If(self.restart):
            m.d.sync += [tick.eq(0), due.eq(0)]
        with m.Elif(tick == t.refresh_period - 1):
            m.d.sync += [tick.eq(0), due.eq(1)]
        with m.Else():
            m.d.sync += tick.eq(tick + 1)

        b = self._beats
        phase = Signal(range(t.latency + t.burst * b + 1))    # cycles since the read was taken
        length = Signal(range(t.burst + 1))
        addr = Signal(32)
        word = Signal(range(t.burst + 1))         # words returned of this read
        beat = Signal(range(b))                   # cycles of the word on the bus, less one
        refresh = Signal(range(t.refresh_cycles + 1))
        busy = Signal()
        writing = Signal(range(b))                # cycles the write holds the bus, less one
        m.d.comb += read.addr.eq(addr + word)
        with m.If(busy):
            m.d.sync += [phase.eq(phase + 1), self.port.rvalid.eq(0)]
            with m.If(phase == t.latency - 1 + length * b):
                m.d.sync += busy.eq(0)
            with m.Elif(phase >= t.latency - 1):          # the data phase
                m.d.sync += beat.eq(beat + 1)
                with m.If(beat == b - 1):
                    m.d.sync += [beat.eq(0), word.eq(word + 1), self.port.rvalid.eq(1)]
        with m.Elif(writing != 0):
            m.d.sync += [writing.eq(writing - 1), self.port.rvalid.eq(0)]
        with m.Elif(refresh != 0):
            m.d.sync += [refresh.eq(refresh - 1), self.port.rvalid.eq(0)]
        with m.Elif(due & ~self.restart):
            m.d.sync += [refresh.eq(t.refresh_cycles - 1), due.eq(0), self.port.rvalid.eq(0)]
        with m.Else():
            m.d.comb += [self.port.cmd_ready.eq(1), self.port.wr_ready.eq(~self.port.cmd_valid)]
            m.d.sync += self.port.rvalid.eq(0)
            with m.If(self.port.cmd_valid):
                m.d.sync += [busy.eq(1), phase.eq(1), addr.eq(self.port.cmd_addr),
                             length.eq(self.port.cmd_len), word.eq(0), beat.eq(0)]
            with m.Elif(self.port.wr_valid):
                m.d.sync += writing.eq(b - 1)
        with m.If(self.restart):
            m.d.sync += refresh.eq(0)
        return m


class MemoryTimeline:
    """:class:`ExternalMemory`'s timing in Python, for the cycle model: the cycles the reads
    of one DMA transfer after another take, in words of ``word_bytes``. Cycle 0 is the one
    with ``restart`` high."""

    def __init__(self, timing: ExtTiming, word_bytes: int):
        self.timing = timing
        self._beats = timing.beats(word_bytes)
        self._free = 0          # the first cycle with no read and no refresh running
        self._served = 0        # refreshes served so far

    def _due(self, k: int) -> int:
        """The first cycle in which refresh ``k`` (from 0) is seen as due."""
        return (k + 1) * self.timing.refresh_period + 1

    def _take(self, cycle: int) -> int:
        """The cycle a command valid from ``cycle`` is taken: once the bus is free and the
        refreshes due by then are served."""
        taken = max(cycle, self._free)
        while self._due(self._served) <= taken:      # refreshes come first
            start = max(self._free, self._due(self._served))
            self._free = start + self.timing.refresh_cycles
            self._served += 1
            taken = max(taken, self._free)
        return taken

    def read(self, valid: int, count: int) -> int:
        """A transfer whose first read command is valid from cycle ``valid`` (each next one
        from the cycle after the previous one is taken) reads ``count`` words in bursts;
        returns the cycle in which its last word arrives (``valid - 1`` for none)."""
        t = self.timing
        last, cycle, left = valid - 1, valid, count
        while left:
            taken = self._take(cycle)
            length = min(left, t.burst)
            last = taken + t.latency - 1 + length * self._beats
            self._free, cycle, left = last + 1, taken + 1, left - length
        return last

    def write(self, valid: int, count: int) -> int:
        """A STOREA whose first word is on the write port from cycle ``valid`` (each next one
        from two cycles after the one before was taken) writes ``count`` words; returns the
        cycle the last one is taken (for none ``valid - 2``, the STOREA's dispatch)."""
        last, cycle = valid - 2, valid
        for _ in range(count):
            last = self._take(cycle)
            self._free, cycle = last + self._beats, last + 2
        return last
