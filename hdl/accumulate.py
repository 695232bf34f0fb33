"""The accumulator buffer with its read-modify-write port behind the array."""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from .bram import RegisteredRAM
from .fanout import REPLICA, replicate

__all__ = ["Accumulators", "acc_write_latency"]


def acc_write_latency(config: ArchConfig) -> int:
    """Cycles from the feeder's write (``we`` with ``sums``) to the block RAM's write of the
    sum: in the pipelined datapath the sum goes into a register first, so that the 32-bit
    adder and comparator and the block RAM's data input are separate register-to-register
    paths (together they were the critical path of a ULX3S-85F build at 84.88 MHz: 11.78 ns,
    7.74 of it routing, from the array's de-skew registers to a DP16KD's ``DIA``)."""
    return 0 if config.compact else 1


class Accumulators(wiring.Component):
    """``acc_depth`` words of ``cols`` int32 accumulators.

    The feeder (``hdl/feeder.py``) reads word ``raddr`` :func:`acc_read_latency` cycles
    before it writes ``sums`` into word ``waddr`` with ``we``: added to the word
    (int32 wrap-around), or, with ``max``, the larger of the two; with ``first`` the sums
    overwrite it. The adder's operand comes from a register, so that the block RAM's output
    and the 32-bit adder and comparator are separate register-to-register paths. No write
    comes one cycle after another to the same word (the feeder waits a cycle instead), so no
    path runs from the adder back into itself (with one, that loop was the critical path of
    a ULX3S-85F build: 12.0 ns, 7.4 of routing).

    The pipelined datapath reads through :class:`~hwonnx.hdl.bram.RegisteredRAM` (on ECP5
    the block's own output register: from a block RAM's output to a register of the fabric
    was the 97.65 MHz ULX3S-85F build's critical path, 10.25 ns) and then the operand
    register: the write three cycles after the read. The sum then waits a cycle in a register
    (:func:`acc_write_latency`) before the block RAM writes it. The words the memory wrote in
    the read's cycle and the one after (which it does not show yet), and the sum waiting in
    that register, are forwarded into the operand register from registers of their own, with
    a select per column (``hdl/fanout.py``). The element-wise engine's writes take no
    register (the engine starts once the feeder is drained, the sum's register included). The
    compact datapath reads one cycle after the address, the memory's read port transparent
    for its write port (a write in the read's cycle is seen), then the operand register.

    The selects that steer every column (``first``, ``max``, ``ew_we``) come with one bit per
    column, all equal, each from a register of its own (``hdl/fanout.py``): one register
    driving all 256 bits of an 8-column word was the critical path of a ULX3S-85F build
    (12.8 ns, 8.2 of routing).

    Members
    -------
    raddr : ``In``: the read-modify-write's read address.
    we, waddr, first, max, sums : ``In``: its write (in the block RAM
        :func:`acc_write_latency` cycles later).
    ew_we, ew_addr, ew_data : ``In``: the element-wise engine writes a whole word (never in
        the same cycle as ``we``); ``ew_we`` has a bit per column, ``ew_we[0]`` enables.
    post_addr : ``In``; post_data : ``Out``: the post-processor's read port, the word
        :data:`~hwonnx.hdl.bram.REGISTERED_READ_LATENCY` cycles after its address.
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
        word = data.ArrayLayout(signed(32), cfg.cols)
        # Every read port is a copy of the memory beside its write port (as Yosys maps two
        # read ports onto block RAMs of one read and one write port each).
        m.submodules.post_mem = post = RegisteredRAM(word, cfg.acc_depth)
        writes = [post.write]
        # The feeder's write as the block RAM takes it (after acc_write_latency registers).
        we, waddr, value = self.we, self.waddr, Signal(word, name="sum")
        if cfg.compact:
            m.submodules.mem = mem = Memory(shape=word, depth=cfg.acc_depth, init=[])
            port = mem.write_port()
            rmw = mem.read_port(transparent_for=(port,))
            m.d.comb += rmw.addr.eq(self.raddr)
            read = Signal(word, name="read")
            m.d.sync += read.eq(rmw.data)
            writes.append(port)
            summed = value
        else:
            m.submodules.rmw_mem = rmw = RegisteredRAM(word, cfg.acc_depth)
            m.d.comb += rmw.read.addr.eq(self.raddr)
            writes.append(rmw.write)
            we, waddr = Signal(name="sum_we"), Signal.like(self.waddr, name="sum_addr")
            summed = Signal(word, name="sum_reg")
            m.d.sync += [we.eq(self.we), waddr.eq(self.waddr), summed.eq(value)]
            read = self._forwarded(m, rmw.read.data, writes[0], summed)
        for port in writes:
            m.d.comb += [port.addr.eq(Mux(self.ew_we[0], self.ew_addr, waddr)),
                         port.en.eq(we | self.ew_we[0])]
        m.d.comb += [post.read.addr.eq(self.post_addr), self.post_data.eq(post.read.data)]
        for c in range(cfg.cols):
            added = Mux(self.first[c], 0, read[c]) + self.sums[c]
            # The larger of the two by the sign of a 33-bit difference, the choice in a wire
            # of its own (``keep``): with ``sums > read`` inside the muxes Yosys mapped each
            # column to 84 LUT4, 64 PFUMX and 33 L6MUX more (ECP5, the accumulators of 8
            # columns alone: 3,090 -> 2,416 LUT4, 823 -> 309 PFUMX, 266 -> 0 L6MUX).
            below = Signal(signed(33), name=f"below_{c}", attrs={"keep": 1})
            pick = Signal(name=f"pick_{c}", attrs={"keep": 1})
            larger = Signal(signed(32), name=f"larger_{c}", attrs={"keep": 1})
            m.d.comb += [below.eq(read[c] - self.sums[c]),
                         pick.eq(self.first[c] | below[-1]),
                         larger.eq(Mux(pick, self.sums[c], read[c])),
                         value[c].eq(Mux(self.max[c], larger, added))]
            for port in writes:
                m.d.comb += port.data[c].eq(Mux(self.ew_we[c], self.ew_data[c], summed[c]))
        return m

    def _forwarded(self, m, stored, write, pending):
        """The operand register: the word read (``stored``, two cycles after the address)
        or, if it was written since, the latest of: what the write port wrote in the read's
        cycle or the one after, and the sum in the write's register (``pending``, the
        feeder's write of the cycle after those)."""
        cfg = self._config
        cols = cfg.cols
        word = data.ArrayLayout(signed(32), cols)
        raddr = Signal.like(self.raddr, name="raddr_1")
        m.d.sync += raddr.eq(self.raddr)
        # The word written in the cycle before (``written``): in t + 2 it is the one written
        # in t + 1 (late), and the one written in t (early) has moved on to ``early_word``.
        written = Signal(word, name="fwd_written")
        early_word = Signal(word, name="fwd_early_word")
        m.d.sync += [written.eq(write.data), early_word.eq(written)]
        early = replicate(m, write.en & (write.addr == self.raddr), cols, "fwd_early")
        early_hit = [Signal(name=f"fwd_early_{c}{REPLICA}") for c in range(cols)]
        m.d.sync += [hit.eq(copy) for hit, copy in zip(early_hit, early)]
        late = replicate(m, write.en & (write.addr == raddr), cols, "fwd_late")
        # The feeder's write in t + 1, in the sum's register in t + 2.
        latest = replicate(m, self.we & (self.waddr == raddr), cols, "fwd_latest")
        read = Signal(word, name="read")
        for c in range(cols):
            m.d.sync += read[c].eq(
                Mux(latest[c], pending[c],
                    Mux(late[c], written[c], Mux(early_hit[c], early_word[c], stored[c]))))
        return read
