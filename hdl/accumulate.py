"""The accumulator buffer with its read-modify-write port behind the array."""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from .feeder import ACC_READ_LATENCY

__all__ = ["Accumulators"]


class Accumulators(wiring.Component):
    """``acc_depth`` words of ``cols`` int32 accumulators.

    The feeder (``hdl/feeder.py``) reads word ``raddr`` :data:`ACC_READ_LATENCY` cycles
    before it writes ``sums`` into word ``waddr`` with ``we``: added to the word
    (int32 wrap-around), or, with ``max``, the larger of the two; with ``first`` the sums
    overwrite it. The read data is registered before the adder, so that the block RAM's
    output (5.6 ns from the clock on ECP5) and the 32-bit adder and comparator are separate
    register-to-register paths. A write two cycles after another to the same word sees it
    (the read port is transparent for the write port); one cycle after (``forward``) it
    takes the word written in the cycle before instead of its read.

    The selects that steer every column (``first``, ``max``, ``forward``, ``ew_we``) come with
    one bit per column, all equal, each from a register of its own (``hdl/fanout.py``): one
    register driving all 256 bits of an 8-column word was the critical path of a ULX3S-85F
    build (12.8 ns, 8.2 of routing). The word kept for forwarding is the sums' (an
    element-wise write is never forwarded), so the element-wise choice is not in that loop.

    Members
    -------
    raddr : ``In``: the read-modify-write's read address.
    we, waddr, first, max, forward, sums : ``In``: its write.
    ew_we, ew_addr, ew_data : ``In``: the element-wise engine writes a whole word (never in
        the same cycle as ``we``); ``ew_we`` has a bit per column, ``ew_we[0]`` enables.
    post_addr : ``In``; post_data : ``Out``: the post-processor's read port (one cycle).
    """

    def __init__(self, config: ArchConfig):
        self._config = config
        word = data.ArrayLayout(signed(32), config.cols)
        super().__init__({
            "raddr": In(config.acc_addr_bits),
            "we": In(1), "waddr": In(config.acc_addr_bits), "first": In(config.cols),
            "max": In(config.cols), "forward": In(config.cols), "sums": In(word),
            "ew_we": In(config.cols), "ew_addr": In(config.acc_addr_bits), "ew_data": In(word),
            "post_addr": In(config.acc_addr_bits), "post_data": Out(word),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        assert ACC_READ_LATENCY == 2        # the port's read, then the register below
        m.submodules.mem = mem = Memory(shape=data.ArrayLayout(signed(32), cfg.cols),
                                        depth=cfg.acc_depth, init=[])
        write = mem.write_port()
        rmw = mem.read_port(transparent_for=(write,))
        post = mem.read_port()
        read = Signal.like(rmw.data)
        written = Signal.like(write.data)         # the read-modify-write's word, a cycle ago
        m.d.sync += read.eq(rmw.data)
        m.d.comb += [rmw.addr.eq(self.raddr),
                     write.addr.eq(Mux(self.ew_we[0], self.ew_addr, self.waddr)),
                     write.en.eq(self.we | self.ew_we[0]),
                     post.addr.eq(self.post_addr), self.post_data.eq(post.data)]
        for c in range(cfg.cols):
            old = Mux(self.forward[c], written[c], read[c])
            added = Mux(self.first[c], 0, old) + self.sums[c]
            larger = Mux(self.first[c] | (self.sums[c] > old), self.sums[c], old)
            result = Mux(self.max[c], larger, added)
            m.d.comb += write.data[c].eq(Mux(self.ew_we[c], self.ew_data[c], result))
            # (the compact datapath keeps the whole write: one logic cell less per bit on
            # iCE40, where the UP5K design is at the edge of its 5,280 cells)
            m.d.sync += written[c].eq(write.data[c] if cfg.compact else result)
        return m
