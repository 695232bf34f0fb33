"""The external memories hwonnx knows: each one's timing behind its controller, in accelerator
cycles, and its size. Data only (a leaf module): the architecture configuration, the cycle
model (``compiler/timing.py``), the memory model (``hdl/extmem.py``) and the boards read it."""

from dataclasses import dataclass, replace

__all__ = ["ExtTiming", "MEMORIES", "ULX3S_SDRAM", "ECPIX5_DDR3", "ARTY_DDR3", "port_bytes"]


@dataclass(frozen=True)
class ExtTiming:
    """Timing of an external memory behind its controller, in accelerator cycles, and its
    size."""
    latency: int = 8            # a read's first word comes this many cycles after it is taken
    burst: int = 16             # the longest read, in words
    refresh_period: int = 195   # a refresh falls due this often ...
    refresh_cycles: int = 4     # ... and takes this long
    size_bytes: int = 32 << 20  # the memory's capacity
    bus_bytes: int = 2          # bytes it moves per cycle

    def __post_init__(self):
        if self.latency < 2 or self.burst < 1 or self.refresh_cycles < 1 \
                or self.refresh_period <= self.refresh_cycles + self.latency + self.burst \
                or self.size_bytes < 1 or self.bus_bytes < 1:
            raise ValueError(f"ExtTiming needs latency >= 2, burst >= 1 and a refresh period "
                             f"longer than a refresh and a read, not {self}")

    def beats(self, word_bytes: int) -> int:
        """Cycles one word of ``word_bytes`` bytes takes on the memory's bus."""
        return -(-word_bytes // self.bus_bytes)

    def transfer_cycles(self, words: int, word_bytes: int) -> int:
        """Cycles a copy of ``words`` of ``word_bytes`` bytes takes in bursts when no refresh
        falls in it."""
        return -(-words // self.burst) * self.latency + words * self.beats(word_bytes)


    def fastest(self, word_bytes: int) -> "ExtTiming":
        """This memory as fast as the DMA engine takes it: a word of ``word_bytes`` every
        cycle, the shortest latency (2) and no refresh (the counterfactual of the
        memory-bound share, ``bench/bench_imagenet.py``)."""
        return replace(self, latency=2, refresh_cycles=1, refresh_period=1 << 40,
                       bus_bytes=word_bytes)

    def slower(self, factor: int) -> "ExtTiming":
        """This memory with ``factor`` times its latency and refresh time, and at most a
        ``factor``-th of its bandwidth: the slow end of the cycle counts ``hwonnx run``
        accepts from a board whose memory timing is an estimate (``docs/protocol.md``)."""
        latency, refresh = factor * self.latency, factor * self.refresh_cycles
        return replace(self, latency=latency, refresh_cycles=refresh,
                       refresh_period=max(self.refresh_period,
                                          refresh + latency + self.burst + 1),
                       bus_bytes=max(1, self.bus_bytes // factor))

    def words(self, word_bytes: int) -> int:
        """The words of ``word_bytes`` bytes the memory holds: each takes a whole power of two
        of bytes (:func:`port_bytes`) on the controller's port."""
        return self.size_bytes // port_bytes(word_bytes)


def port_bytes(word_bytes: int) -> int:
    """Bytes a word of ``word_bytes`` takes in the memory: the next power of two (LiteDRAM's
    ports convert between power-of-two ratios of its own width only)."""
    return 1 << (word_bytes - 1).bit_length()


#: The ULX3S's 32 MB SDR SDRAM (16 data bits) behind a controller at 25 MHz: CAS latency 2
#: plus activate, precharge and the controller's registers; 8,192 refreshes every 64 ms (one
#: per 7.8 us).
ULX3S_SDRAM = ExtTiming(latency=8, burst=16, refresh_period=195, refresh_cycles=4,
                        size_bytes=32 << 20, bus_bytes=2)

#: The ECPIX-5's 512 MB DDR3 (MT41K256M16, 16 data bits at 100 MHz: 400 MB/s, 16 bytes per
#: 25 MHz accelerator cycle) behind LiteDRAM's ECP5 DDR3 controller at 50 MHz and the
#: clock-domain crossing (``boards/dram.py: NativePortCDC``). A model, not a measurement:
#: a read's first word after about 20 controller cycles (activate, CL 6, the PHY's read
#: latency of CL + 10 cycles, LiteDRAM's command path) and 3 accelerator cycles each way
#: through the crossing: 16 accelerator cycles; 8,192 refreshes every 64 ms (one per 7.8 us)
#: of tRFC 260 ns plus the precharge before it: 8 cycles.
ECPIX5_DDR3 = ExtTiming(latency=16, burst=16, refresh_period=195, refresh_cycles=8,
                        size_bytes=512 << 20, bus_bytes=16)

#: The Arty A7's 256 MB DDR3 (MT41K128M16, 16 data bits at 400 MHz: 1.6 GB/s, a word a
#: cycle at the board's 40 MHz) behind LiteDRAM's Artix-7 controller at 100 MHz and the
#: crossing. A model, as above: about 20 controller cycles to a read's first word (the PHY's
#: CL + 6 cycles, activate, the command path), 3 accelerator cycles each way through the
#: crossing: 14 cycles at 40 MHz; a refresh every 7.8 us (312 cycles) of tRFC 160 ns plus
#: the precharge: 8 cycles.
ARTY_DDR3 = ExtTiming(latency=14, burst=16, refresh_period=312, refresh_cycles=8,
                      size_bytes=256 << 20, bus_bytes=32)

#: External memories by the name ``ArchConfig.ext_memory`` gives.
MEMORIES = {"ulx3s-sdram": ULX3S_SDRAM, "ecpix5-ddr3": ECPIX5_DDR3, "arty-ddr3": ARTY_DDR3}
