"""A buffer in banks one block RAM deep, each bank's read data in a register of its own."""

from amaranth.hdl import Array, Module, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import Out
from amaranth.utils import ceil_log2

from .bram import BLOCK_DEPTH, REGISTERED_READ_LATENCY, RegisteredRAM
from .fanout import replicate

__all__ = ["BankedMemory", "BANK_DEPTH", "BANKED_READ_LATENCY", "BANKS_PER_ADDRESS"]

#: Words of one bank: one block RAM deep (:class:`~hwonnx.hdl.bram.RegisteredRAM`: an ECP5
#: DP16KD in its 1024 x 18 shape; a bank of any width maps to blocks side by side, with no
#: multiplexer between blocks of different depths).
BANK_DEPTH = BLOCK_DEPTH

#: Cycles from a read's address to its word on ``read.data``: the address in registers (a copy
#: for each group of :data:`BANKS_PER_ADDRESS` banks), the block RAM's read, then each bank's
#: data in its register (on ECP5 the block's own); the word is chosen among the banks'
#: registers after that.
BANKED_READ_LATENCY = 1 + REGISTERED_READ_LATENCY

#: Banks that share one copy of the read address: a copy drives the address pins of its
#: bank's block RAMs only (four ECP5 DP16KD per bank of an 8-column array), not those of every
#: block across the die.
BANKS_PER_ADDRESS = 1


class BankedMemory(wiring.Component):
    """``depth`` words of ``shape`` in banks of :data:`BANK_DEPTH` words, with one write port
    and one read port whose word is on ``data`` :data:`BANKED_READ_LATENCY` cycles after its
    address (``en`` is ignored: every bank reads in every cycle). A block RAM's output is
    slow (5.6 ns from the clock on ECP5) and the blocks of a large buffer lie across the die:
    read through a multiplexer into one register, the weight buffer's 40 blocks limited an
    ECP5 build to 92 MHz. Here each bank's output drives only its own register (on ECP5 the
    block's output register, :class:`~hwonnx.hdl.bram.RegisteredRAM`), and the multiplexer
    runs from those registers. With ``banked`` False, one memory (the smallest
    devices, whose clock does not need the registers): the word one cycle after its address.

    The read address is registered too, one copy per :data:`BANKS_PER_ADDRESS` banks: from
    one register to the address pins of 32 block RAMs (a 16-bank buffer of an 8-column array
    in 512-word banks), the routing took 8.7 of a 10.7 ns path on a ULX3S-85F. A reader that
    keeps its timing presents each address a cycle early (``hdl/loader.py``).

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
        banks = -(-self._depth // size)
        addresses = [self.read.addr]
        if self.banked:
            addresses = replicate(m, self.read.addr, -(-banks // BANKS_PER_ADDRESS), "read_addr")
        select = addresses[0][low:]
        outputs = []
        for b in range(banks):
            words = self._init[b * size:(b + 1) * size]
            enable = self.write.en & (self.write.addr[low:] == b)
            if not self.banked:
                m.submodules[f"bank_{b}"] = mem = Memory(shape=self._shape, depth=self._depth,
                                                         init=words)
                write, read = mem.write_port(), mem.read_port()
                m.d.comb += [write.addr.eq(self.write.addr), write.data.eq(self.write.data),
                             write.en.eq(enable), read.addr.eq(self.read.addr),
                             read.en.eq(self.read.en), self.read.data.eq(read.data)]
                return m
            m.submodules[f"bank_{b}"] = bank = RegisteredRAM(
                self._shape, min(size, self._depth - b * size), init=words)
            m.d.comb += [bank.write.addr.eq(self.write.addr), bank.write.data.eq(self.write.data),
                         bank.write.en.eq(enable),
                         bank.read.addr.eq(addresses[b // BANKS_PER_ADDRESS])]
            outputs.append(bank.read.data)
        chosen = Signal.like(select, name="bank_chosen")
        chosen_d = Signal.like(select, name="bank_chosen_d")
        m.d.sync += [chosen.eq(select), chosen_d.eq(chosen)]
        m.d.comb += self.read.data.eq(Array(outputs)[chosen_d] if len(outputs) > 1
                                      else outputs[0])
        return m
