"""A buffer in banks one block RAM deep, each bank's read data in a register of its own."""

from amaranth.hdl import Array, Module, Shape, Signal, Value
from amaranth.lib import memory, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import Out
from amaranth.utils import ceil_log2

__all__ = ["BankedMemory", "BANK_DEPTH", "BANKED_READ_LATENCY"]

#: Words of one bank: one ECP5 DP16KD deep in its 512 x 36 shape (a bank of any width maps to
#: blocks side by side, with no multiplexer between blocks of different depths).
BANK_DEPTH = 512

#: Cycles from a read's address to its word on ``read.data``: the block RAM's read, then each
#: bank's data in its register; the word is chosen among the banks' registers after that.
BANKED_READ_LATENCY = 2


class BankedMemory(wiring.Component):
    """``depth`` words of ``shape`` in banks of :data:`BANK_DEPTH` words, with one write port
    and one read port whose word is on ``data`` :data:`BANKED_READ_LATENCY` cycles after its
    address (``en`` is ignored: every bank reads in every cycle). A block RAM's output is
    slow (5.6 ns from the clock on ECP5) and the blocks of a large buffer lie across the die:
    read through a multiplexer into one register, the weight buffer's 40 blocks limited an
    ECP5 build to 92 MHz. Here each bank's output drives only its own register, and the
    multiplexer runs from those registers. With ``banked`` False, one memory (the smallest
    devices, whose clock does not need the registers): the word one cycle after its address.

    Members
    -------
    read : ``Out(memory.ReadPort.Signature(...))``: as a memory's ``read_port()``, with
        :attr:`read_latency`.
    write : ``Out(memory.WritePort.Signature(...))``: as a memory's ``write_port()``.
    """

    def __init__(self, shape, depth: int, init=(), banked: bool = True):
        self._shape, self._depth, self._init = shape, depth, list(init)
        self._banked = banked
        self._bank_depth = BANK_DEPTH if banked else depth
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
        select = self.read.addr[low:]
        outputs = []
        for b in range(-(-self._depth // size)):
            m.submodules[f"bank_{b}"] = mem = Memory(
                shape=self._shape, depth=min(size, self._depth - b * size),
                init=self._init[b * size:(b + 1) * size])
            write, read = mem.write_port(), mem.read_port()
            m.d.comb += [write.addr.eq(self.write.addr), write.data.eq(self.write.data),
                         write.en.eq(self.write.en & (self.write.addr[low:] == b)),
                         read.addr.eq(self.read.addr)]
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
