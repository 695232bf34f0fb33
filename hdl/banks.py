"""A buffer in banks one block RAM deep, each bank's read data in a register of its own."""

from amaranth.hdl import Array, Module, Shape, Signal, Value
from amaranth.lib import memory, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import Out
from amaranth.utils import ceil_log2

from .fanout import replicate

__all__ = ["BankedMemory", "BANKED_READ_LATENCY", "WIDE_WORD_BITS", "banking"]

#: Bits above which a word is wide (a 16-column array's 128): its banks are one ECP5 DP16KD deep
#: in the 2048 x 9 shape, 15 blocks side by side, each bank with a copy of the read address of
#: its own. A narrower word's (an 8-column array's 64 bits) are 512 words deep (512 x 36, two
#: blocks), two banks to a copy of the address. Each bank's read data crosses the die to its
#: register and the multiplexer: in 512-word banks the 16x16 array's weight buffer (5,120
#: words, 10 banks) sent 1,280 such wires, the most congested nets of its place and route
#: (nextpnr's router2 heatmap), and its router's overuse plateaued at ~30k; in 2048-word banks
#: (3 banks, 384 wires, 38 blocks rather than 40) at ~16k. The 8x8 array on the ULX3S-85F,
#: which routes either way, measured 100.19 MHz with 512-word banks and 89.35 with 2048-word
#: ones (its critical path the walker's, 1.2 ns more routing).
WIDE_WORD_BITS = 72


def banking(width: int) -> "tuple[int, int]":
    """``(bank_depth, banks_per_address)`` of a banked memory of ``width``-bit words: the
    words of one bank (a bank of any width maps to blocks side by side, with no multiplexer
    between blocks of different depths), and the banks that share one copy of the read
    address (a copy drives the address pins of its banks' block RAMs only, not those of every
    block across the die)."""
    return (2048, 1) if width > WIDE_WORD_BITS else (512, 2)


#: Cycles from a read's address to its word on ``read.data``: the address in registers (a copy
#: for each group of banks, :func:`banking`), the block RAM's read, then each bank's data in
#: its register; the word is chosen among the banks' registers after that.
BANKED_READ_LATENCY = 3


class BankedMemory(wiring.Component):
    """``depth`` words of ``shape`` in banks (:func:`banking`), with one write port
    and one read port whose word is on ``data`` :data:`BANKED_READ_LATENCY` cycles after its
    address (``en`` is ignored: every bank reads in every cycle). A block RAM's output is
    slow (5.6 ns from the clock on ECP5) and the blocks of a large buffer lie across the die:
    read through a multiplexer into one register, the weight buffer's 40 blocks limited an
    ECP5 build to 92 MHz. Here each bank's output drives only its own register, and the
    multiplexer runs from those registers. With ``banked`` False, one memory (the smallest
    devices, whose clock does not need the registers): the word one cycle after its address.

    The banks are memories that Yosys maps, each with a register of the fabric, not the
    DP16KD blocks with their own output register of :class:`~hwonnx.hdl.bram.RegisteredRAM`:
    with those, Yosys 0.70 fails an assertion in its ABC9 reintegration
    (``GetSize(conn.first) == GetSize(conn.second)``, ``kernel/rtlil.cc``) on the 16x16
    ULX3S-85F board top (the program's, parameters' and accumulators' blocks alone pass).

    The read address is registered too, one copy per group of banks (:func:`banking`): from
    one register to the address pins of 32 block RAMs (a 16-bank buffer of an 8-column array),
    the routing took 8.7 of a 10.7 ns path on a ULX3S-85F. A reader that keeps its timing
    presents each address a cycle early (``hdl/loader.py``).

    Members
    -------
    read : ``Out(memory.ReadPort.Signature(...))``: as a memory's ``read_port()``, with
        :attr:`read_latency`.
    write : ``Out(memory.WritePort.Signature(...))``: as a memory's ``write_port()``.
    """

    def __init__(self, shape, depth: int, init=(), banked: bool = True):
        self._shape, self._depth, self._init = shape, depth, list(init)
        self._banked = banked
        self._bank_depth, self._per_address = banking(Shape.cast(shape).width)
        if not banked:
            self._bank_depth = depth
        bits = ceil_log2(depth)
        super().__init__({
            "read": Out(memory.ReadPort.Signature(addr_width=bits, shape=shape)),
            "write": Out(memory.WritePort.Signature(addr_width=bits, shape=shape)),
        })

    @property
    def banked(self) -> bool:
        return self._banked

    @property
    def read_latency(self) -> int:
        return BANKED_READ_LATENCY if self.banked else 1

    def elaborate(self, platform):
        m = Module()
        size = self._bank_depth
        low = min(ceil_log2(self._depth), ceil_log2(size))
        banks = -(-self._depth // size)
        addresses = [self.read.addr]
        if self.banked:
            addresses = replicate(m, self.read.addr, -(-banks // self._per_address), "read_addr")
        select = addresses[0][low:]
        outputs = []
        for b in range(banks):
            m.submodules[f"bank_{b}"] = mem = Memory(
                shape=self._shape, depth=min(size, self._depth - b * size),
                init=self._init[b * size:(b + 1) * size])
            write, read = mem.write_port(), mem.read_port()
            m.d.comb += [write.addr.eq(self.write.addr), write.data.eq(self.write.data),
                         write.en.eq(self.write.en & (self.write.addr[low:] == b)),
                         read.addr.eq(addresses[b // self._per_address])]
            if not self.banked:
                m.d.comb += [read.en.eq(self.read.en), self.read.data.eq(read.data)]
                return m
            held = Signal(Shape.cast(self._shape).width, name=f"bank_{b}_data")
            m.d.sync += held.eq(Value.cast(read.data))
            outputs.append(held)
        chosen = Signal.like(select, name="bank_chosen")
        chosen_d = Signal.like(select, name="bank_chosen_d")
        m.d.sync += [chosen.eq(select), chosen_d.eq(chosen)]
        m.d.comb += self.read.data.eq(Array(outputs)[chosen_d] if len(outputs) > 1
                                      else outputs[0])
        return m
