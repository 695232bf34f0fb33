"""A block RAM whose read data leaves from a register: on ECP5, the block's own output register."""

from amaranth.hdl import (Array, Cat, ClockSignal, Const, Instance, Module, Shape, ShapeCastable,
                          Signal, Value)
from amaranth.lib import memory, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import Out
from amaranth.utils import ceil_log2

__all__ = ["RegisteredRAM", "REGISTERED_READ_LATENCY", "BLOCK_DEPTH", "BLOCK_WIDTH",
           "block_initvals", "buffer_read_latency"]

#: Cycles from a read's address to its word on ``read.data``: the block's read, then its
#: output register.
REGISTERED_READ_LATENCY = 2


def buffer_read_latency(config) -> int:
    """Cycles from an address to its word of a buffer read through a :class:`RegisteredRAM`
    (the program memory, the activation buffer): a memory's read port (1) in the compact
    datapath of the smallest devices, whose clock does not need the register."""
    return 1 if config.compact else REGISTERED_READ_LATENCY

#: One ECP5 DP16KD in its 1024 x 18 shape: the widest with two ports of their own (the
#: 512 x 36 shape takes both ports' data pins for one port).
BLOCK_DEPTH, BLOCK_WIDTH = 1024, 18

#: Bits of a byte in that shape: a write's byte enables (``AD[1:0]``) cover bits 0-8 and 9-17.
_BLOCK_BYTE = 9

#: DP16KD's 16 kbit + parity as 64 ``INITVAL`` parameters of 320 bits: 16 words of 18 bits,
#: each in 20 (as Yosys's ``brams_map_16kd.v`` lays them out).
_INITVALS, _PER_INITVAL, _SLOT = 64, 16, 20


def block_initvals(words: "list[int]") -> "dict[str, Const]":
    """The ``INITVAL_xx`` parameters of a DP16KD in its 1024 x 18 shape holding ``words``
    (at most 1024 of 18 bits)."""
    assert len(words) <= BLOCK_DEPTH
    params = {}
    for index in range(_INITVALS):
        value = 0
        for i, word in enumerate(words[index * _PER_INITVAL:(index + 1) * _PER_INITVAL]):
            value |= (word & (2 ** BLOCK_WIDTH - 1)) << (i * _SLOT)
        params[f"p_INITVAL_{index:02X}"] = Const(value, _PER_INITVAL * _SLOT)
    return params


def _bits(shape, word) -> int:
    """A memory's initial word (an integer, a constant of ``shape``, or what its layout's
    ``const`` takes) as its bits."""
    if isinstance(word, int):
        return word
    if hasattr(word, "as_bits"):
        return word.as_bits()
    if isinstance(shape, ShapeCastable):
        return shape.const(word).as_bits()
    raise TypeError(f"Cannot use {word!r} as a word of a memory of shape {shape!r}")


class RegisteredRAM(wiring.Component):
    """``depth`` words of ``shape`` with one write port and one read port whose word is on
    ``data`` :data:`REGISTERED_READ_LATENCY` cycles after its address, read in a cycle with
    ``en`` high (the word stays while ``en`` is low, as a memory's read port). A write is
    seen by a read whose address comes in a later cycle, not by one in the same cycle (that
    read's word is unspecified on ECP5). With a ``granularity`` (as a memory's
    ``write_port``), the write port's ``en`` has a bit per part of the word; on ECP5 a part
    is at most 9 bits, two to a block, each under one of the block's byte enables.

    A block RAM's output is slow: 5.6-5.8 ns from the clock on an ECP5 of speed grade 6,
    which with the routing to a flip-flop of the fabric was the whole of a 10.3 ns critical
    path (ULX3S-85F, the accumulators' read into their register). The memory is in banks of
    :data:`BLOCK_DEPTH` words, each bank's word in a register, the word chosen among them
    after the registers. On ECP5 (the platform's family ``ecp5``) a bank is DP16KD blocks in
    their 1024 x 18 shape and the register is the read port's own output register
    (``REGMODE_B`` ``OUTREG``), instantiated here because Yosys's mapping never uses it.
    Elsewhere (simulation, the other families), and for a memory of at most 512 words (Yosys
    puts it in blocks of 512 x 36, half as many: the parameters of a 16-column array take 32
    instead of 64 of the 85F's 208), a bank is a memory and a register of the fabric, with the
    same cycles.
    """

    def __init__(self, shape, depth: int, init=(), granularity: "int | None" = None):
        self._shape, self._depth = shape, depth
        self._width = Shape.cast(shape).width
        self._init = [_bits(shape, word) & (2 ** self._width - 1) for word in init]
        bits = ceil_log2(max(depth, 2))
        write = memory.WritePort.Signature(addr_width=bits, shape=shape, granularity=granularity)
        #: bits of a part of the word under one write enable
        self._part = self._width // Shape.cast(write.members["en"].shape).width
        super().__init__({
            "read": Out(memory.ReadPort.Signature(addr_width=bits, shape=shape)),
            "write": Out(write),
        })

    def elaborate(self, platform):
        m = Module()
        # (a memory of at most 512 words fits Yosys's 512 x 36 blocks, half as many)
        ecp5 = getattr(platform, "family", None) == "ecp5" and self._depth > BLOCK_DEPTH // 2
        banks = -(-self._depth // BLOCK_DEPTH)
        low = ceil_log2(BLOCK_DEPTH)
        outputs = []
        for b in range(banks):
            depth = min(BLOCK_DEPTH, self._depth - b * BLOCK_DEPTH)
            words = self._init[b * BLOCK_DEPTH:(b + 1) * BLOCK_DEPTH]
            enable = self.write.en
            if banks > 1:
                enable = self.write.en & (self.write.addr[low:] == b).replicate(len(enable))
            out = Signal(self._width, name=f"bank_{b}_data")
            (self._blocks if ecp5 else self._memory)(m, f"bank_{b}", depth, words, enable, out)
            outputs.append(out)
        if banks == 1:
            m.d.comb += self.read.data.eq(outputs[0])
            return m
        select = self.read.addr[low:]
        chosen = [Signal.like(select, name=f"bank_chosen_{i}") for i in range(2)]
        with m.If(self.read.en):
            m.d.sync += chosen[0].eq(select)
        m.d.sync += chosen[1].eq(chosen[0])
        m.d.comb += self.read.data.eq(Array(outputs)[chosen[1]])
        return m

    def _memory(self, m, name, depth, words, enable, out):
        """A bank of the fabric: a memory, then a register."""
        m.submodules[name] = mem = Memory(shape=self._width, depth=depth, init=words)
        write = mem.write_port(granularity=self._part if self._part < self._width else None)
        read = mem.read_port()
        m.d.comb += [write.addr.eq(self.write.addr), write.en.eq(enable),
                     write.data.eq(Value.cast(self.write.data)), read.addr.eq(self.read.addr),
                     read.en.eq(self.read.en)]
        m.d.sync += out.eq(read.data)

    def _blocks(self, m, name, depth, words, enable, out):
        """A bank of ECP5 DP16KD side by side, each ``BLOCK_WIDTH`` bits of the word, or two
        parts of at most :data:`_BLOCK_BYTE` bits under the block's two byte enables."""
        data_in = Value.cast(self.write.data)
        parted = self._part < self._width
        assert not parted or self._part <= _BLOCK_BYTE
        # each block's bits of the word, as (bit of the word, bit of the block) pairs, and
        # the write enables of its two bytes (both the port's one without parts)
        if parted:
            parts = -(-self._width // self._part)
            slices = [[(p * self._part + i, j * _BLOCK_BYTE + i)
                       for j, p in enumerate(range(s, min(s + 2, parts)))
                       for i in range(self._part)] for s in range(0, parts, 2)]
            byte_en = [[enable[p] if p < parts else 0 for p in (s, s + 1)]
                       for s in range(0, parts, 2)]
        else:
            slices = [[(s * BLOCK_WIDTH + i, i) for i in range(BLOCK_WIDTH)
                       if s * BLOCK_WIDTH + i < self._width]
                      for s in range(-(-self._width // BLOCK_WIDTH))]
            byte_en = [[1, 1]] * len(slices)         # (WEA is the port's enable)
        for s, (pairs, (be0, be1)) in enumerate(zip(slices, byte_en)):
            ports = {}
            for i in range(14):                 # x18: the word's address on AD[13:4]; AD[1:0]
                a = i - 4                       # the write's two byte enables
                ports[f"i_ADA{i}"] = (be0, be1, 0, 0)[i] if a < 0 else \
                    (self.write.addr[a] if a < len(self.write.addr) else 0)
                ports[f"i_ADB{i}"] = 0 if a < 0 or a >= len(self.read.addr) \
                    else self.read.addr[a]
            for i in range(BLOCK_WIDTH):
                ports[f"i_DIA{i}"] = 0
                ports[f"i_DIB{i}"] = 0
            block_words = [0] * len(words)
            for bit, pin in pairs:
                ports[f"i_DIA{pin}"] = data_in[bit]
                ports[f"o_DOB{pin}"] = out[bit]
                for w, word in enumerate(words):
                    block_words[w] |= ((word >> bit) & 1) << pin
            m.submodules[f"{name}_block_{s}"] = Instance(
                "DP16KD", p_DATA_WIDTH_A=BLOCK_WIDTH, p_DATA_WIDTH_B=BLOCK_WIDTH,
                p_REGMODE_A="NOREG", p_REGMODE_B="OUTREG", p_RESETMODE="SYNC",
                p_ASYNC_RESET_RELEASE="SYNC", p_CSDECODE_A="0b000", p_CSDECODE_B="0b000",
                p_WRITEMODE_A="NORMAL", p_WRITEMODE_B="NORMAL", p_GSR="DISABLED",
                **block_initvals(block_words),
                i_CLKA=ClockSignal(), i_CEA=1, i_OCEA=1,
                i_WEA=Cat(be0, be1).any() if parted else enable, i_RSTA=0,
                i_CSA0=0, i_CSA1=0, i_CSA2=0,
                i_CLKB=ClockSignal(), i_CEB=self.read.en, i_OCEB=1, i_WEB=0, i_RSTB=0,
                i_CSB0=0, i_CSB1=0, i_CSB2=0, **ports)
