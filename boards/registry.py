"""The boards hwonnx knows: amaranth-boards platforms plus what the compiler needs."""

import importlib
from dataclasses import dataclass, replace

from ..config import ArchConfig
from ..errors import ResourceError

__all__ = ["Family", "Board", "FAMILIES", "BOARDS", "get_board"]


@dataclass(frozen=True)
class Family:
    """How an FPGA family implements the accelerator's multipliers and memories.

    ``mults_per_dsp``: 8x8 multipliers one DSP block holds as Yosys/the vendor tool maps them
    (one per block: Yosys never packs two 8x8 products into one SB_MAC16 by itself);
    ``dsps_per_wide_mult``: DSP blocks of one 32x32 requantization multiplier;
    ``block_bits`` and ``block_widths``: one block RAM's capacity and its data widths;
    ``luts_per_pe``: logic cells of one PE beside its multiplier, ``luts_base``: the
    controller, post-processor and host link;
    ``luts_per_mult``: logic cells of one 8x8 multiplier built from logic, nonzero for families
    whose board builds keep the PE multipliers out of the DSP blocks (iCE40: its 8 SB_MAC16
    are kept for the requantizers, the products go through Yosys's ``booth`` pass);
    ``huge_bits``, ``huge_width``: one single-port RAM block (iCE40 UltraPlus SPRAM) that a
    program memory loaded at run time (``ArchConfig.prog_width``) maps onto.
    """
    name: str
    toolchain: str
    mults_per_dsp: int
    dsps_per_wide_mult: int
    block_bits: int
    block_widths: "tuple[int, ...]"
    luts_per_pe: int
    luts_base: int
    open_flow: bool          # a bitstream can be built with YoWASP from PyPI
    luts_per_mult: int = 0
    huge_bits: int = 0
    huge_width: int = 0


FAMILIES = {f.name: f for f in [
    Family("ice40", "Yosys + nextpnr-ice40 (YoWASP)", 1, 4, 4096, (16, 8, 4, 2), 60, 3600, True,
           luts_per_mult=150, huge_bits=262144, huge_width=16),
    Family("ecp5", "Yosys + nextpnr-ecp5 (YoWASP)", 1, 4, 18432, (36, 18, 9), 70, 4000, True),
    Family("xilinx7", "Vivado", 1, 4, 36864, (72, 36, 18, 9), 45, 3000, False),
    Family("cyclonev", "Quartus", 3, 2, 10240, (40, 20, 10), 45, 3000, False),
    Family("gowin", "Yosys + nextpnr-himbaechel (Apicula)", 1, 4, 18432, (36, 18, 9), 70,
           4000, False),
]}


@dataclass(frozen=True)
class Board:
    """A target board: its amaranth-boards platform (pinout, clocks, toolchain scripts) and
    the capacities the fit check and the compiler use."""
    name: str
    description: str
    platform_path: str           # "module:Class" in amaranth_boards; "" for simulation
    family: str
    dsp: int
    bram_kbits: int
    luts: int
    default_config: ArchConfig
    clock_hz: int                # the clock the accelerator runs at on this board: the 8x8
    #                              array reaches 40.8 MHz on ECP5 (bench/results/boards.md);
    #                              Xilinx/Intel/Gowin clocks are unmeasured here (no tools)
    pll: bool = False            # derive clock_hz from the board oscillator with a PLL
    huge_rams: int = 0           # single-port RAM blocks (iCE40 SPRAM) for the program

    @property
    def is_simulation(self) -> bool:
        return not self.platform_path

    def platform(self):
        """A new instance of the amaranth-boards platform class."""
        module, _, cls = self.platform_path.partition(":")
        return getattr(importlib.import_module(f"amaranth_boards.{module}"), cls)()

    @property
    def family_info(self) -> Family:
        return FAMILIES[self.family]


def _cfg(rows, cols, act, wgt, acc, par, prog, clock, prog_width=0, lut_tables=4,
         walker=True) -> ArchConfig:
    return ArchConfig(rows=rows, cols=cols, act_depth=act, wgt_depth=wgt, acc_depth=acc,
                      par_depth=par, prog_depth=prog, clock_hz=clock, prog_width=prog_width,
                      lut_tables=lut_tables, walker=walker)


BOARDS = {board.name: board for board in [
    Board("sim", "no board: cycle-accurate Verilator simulation", "", "ecp5", 0, 0, 0,
          ArchConfig(), 50_000_000),
    Board("icebreaker", "1BitSquared iCEBreaker, Lattice iCE40 UP5K", "icebreaker:"
          "ICEBreakerPlatform", "ice40", 8, 120, 5280,
          # The program (7 words of 64 bits per instruction) lives in the four SPRAMs and is
          # loaded over the UART; the block RAMs hold weights, parameters and activations. One
          # column: the 8 DSPs make two 32x32 requantizers, but the logic holds only one.
          # Two activation tables fill one more block RAM. No tile walker: its 1,250
          # flip-flops do not fit beside the array, so every tile is stored.
          _cfg(4, 1, 512, 4096, 64, 64, 2304, 12_000_000, prog_width=64, lut_tables=2,
               walker=False),
          12_000_000,
          huge_rams=4),
    Board("ulx3s-85f", "Radiona ULX3S, Lattice ECP5 LFE5U-85F", "ulx3s:ULX3S_85F_Platform",
          "ecp5", 156, 3744, 83640, _cfg(8, 8, 4096, 4096, 1024, 128, 1024, 25_000_000),
          25_000_000),
    Board("ecpix5-85", "LambdaConcept ECPIX-5, Lattice ECP5 LFE5UM5G-85F",
          "ecpix5:ECPIX585Platform", "ecp5", 156, 3744, 83640,
          _cfg(8, 8, 4096, 4096, 1024, 128, 1024, 25_000_000), 25_000_000, pll=True),
    Board("arty-a7-35", "Digilent Arty A7-35T, Xilinx Artix-7 XC7A35T",
          "arty_a7:ArtyA7_35Platform", "xilinx7", 90, 1800, 20800,
          _cfg(8, 6, 2048, 2048, 512, 64, 512, 40_000_000), 40_000_000, pll=True),
    Board("arty-a7-100", "Digilent Arty A7-100T, Xilinx Artix-7 XC7A100T",
          "arty_a7:ArtyA7_100Platform", "xilinx7", 240, 4860, 63400,
          _cfg(12, 12, 4096, 4096, 1024, 128, 1024, 40_000_000), 40_000_000, pll=True),
    Board("de10-nano", "Terasic DE10-Nano, Intel Cyclone V 5CSEBA6", "de10_nano:"
          "DE10NanoPlatform", "cyclonev", 112, 5570, 83820,
          _cfg(12, 12, 4096, 4096, 1024, 128, 1024, 50_000_000), 50_000_000),
    Board("tang-primer-20k", "Sipeed Tang Primer 20K, Gowin GW2A-18", "tang_primer_20k:"
          "TangPrimer20kPlatform", "gowin", 48, 828, 20736,
          _cfg(4, 4, 2048, 2048, 256, 64, 512, 27_000_000), 27_000_000),
]}


def get_board(name: str) -> Board:
    if name not in BOARDS:
        raise ResourceError(f"Unknown board '{name}'; known boards are "
                            f"{', '.join(sorted(BOARDS))}")
    return BOARDS[name]


def with_clock(board: Board, config: ArchConfig) -> ArchConfig:
    """``config`` with the board's accelerator clock."""
    return replace(config, clock_hz=board.clock_hz)
