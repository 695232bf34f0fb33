"""The single-port program memory of a narrow-fetch accelerator (``ArchConfig.prog_width``)."""

from amaranth.hdl import ClockSignal, Instance, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["ProgramRAM", "SPRAM_DEPTH", "SPRAM_WIDTH"]

#: Geometry of one iCE40 UltraPlus ``SB_SPRAM256KA``.
SPRAM_DEPTH, SPRAM_WIDTH = 16384, 16


def _is_ice40_ultraplus(platform) -> bool:
    return str(getattr(platform, "device", "")).startswith("iCE40UP")


class ProgramRAM(wiring.Component):
    """``depth`` words of ``width`` bits behind one port: write ``data`` at ``addr`` when
    ``we``, otherwise read ``addr`` when ``re`` (``rdata`` holds the word in the next cycle).

    On an iCE40 UltraPlus it is ``width / 16`` ``SB_SPRAM256KA`` blocks side by side: Yosys
    does not infer them from a memory whose read and write ports merely share an address, and
    the program (up to 16K words) would otherwise take most of the device's block RAM. SPRAM
    has no initial contents, so the program is loaded at run time. Elsewhere (simulation, other
    families) it is a plain memory.
    """

    def __init__(self, depth: int, width: int):
        self.depth, self.width = depth, width
        super().__init__({"addr": In(range(depth)), "we": In(1), "re": In(1),
                          "data": In(width), "rdata": Out(width)})

    def elaborate(self, platform):
        m = Module()
        if _is_ice40_ultraplus(platform):
            if self.depth > SPRAM_DEPTH or self.width % SPRAM_WIDTH:
                raise ValueError(f"An iCE40 SPRAM program memory must have at most "
                                 f"{SPRAM_DEPTH} words of a multiple of {SPRAM_WIDTH} bits, "
                                 f"not {self.depth} x {self.width}")
            address = Signal(14)
            m.d.comb += address.eq(self.addr)
            for k in range(self.width // SPRAM_WIDTH):
                bits = slice(k * SPRAM_WIDTH, (k + 1) * SPRAM_WIDTH)
                m.submodules[f"spram{k}"] = Instance(
                    "SB_SPRAM256KA",
                    i_ADDRESS=address, i_DATAIN=self.data[bits], i_MASKWREN=0b1111,
                    i_WREN=self.we, i_CHIPSELECT=self.we | self.re, i_CLOCK=ClockSignal(),
                    i_STANDBY=0, i_SLEEP=0, i_POWEROFF=1, o_DATAOUT=self.rdata[bits])
            return m
        m.submodules.mem = mem = Memory(shape=self.width, depth=self.depth, init=[])
        write, read = mem.write_port(), mem.read_port()
        m.d.comb += [write.addr.eq(self.addr), write.data.eq(self.data), write.en.eq(self.we),
                     read.addr.eq(self.addr), read.en.eq(self.re & ~self.we),
                     self.rdata.eq(read.data)]
        return m
