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
    (the read port is transparent for the write port); none comes one cycle after another to
    the same word (the feeder waits a cycle instead), so nothing is forwarded and no path
    runs from the adder back into itself (with forwarding, that loop was the critical path
    of a ULX3S-85F build: 12.0 ns, 7.4 of routing).

    The selects that steer every column (``first``, ``max``, ``ew_we``) come with one bit per
    column, all equal, each from a register of its own (``hdl/fanout.py``): one register
    driving all 256 bits of an 8-column word was the critical path of a ULX3S-85F build
    (12.8 ns, 8.2 of routing).

    Members
    -------
    raddr : ``In``: the read-modify-write's read address.
    we, waddr, first, max, sums : ``In``: its write.
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
            "max": In(config.cols), "sums": In(word),
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
        m.d.sync += read.eq(rmw.data)
        m.d.comb += [rmw.addr.eq(self.raddr),
                     write.addr.eq(Mux(self.ew_we[0], self.ew_addr, self.waddr)),
                     write.en.eq(self.we | self.ew_we[0]),
                     post.addr.eq(self.post_addr), self.post_data.eq(post.data)]
        for c in range(cfg.cols):
            added = Mux(self.first[c], 0, read[c]) + self.sums[c]
            larger = Mux(self.first[c] | (self.sums[c] > read[c]), self.sums[c], read[c])
            m.d.comb += write.data[c].eq(Mux(self.ew_we[c], self.ew_data[c],
                                             Mux(self.max[c], larger, added)))
        return m
