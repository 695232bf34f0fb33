"""The boards hwonnx knows: amaranth-boards platforms plus what the compiler needs."""

import importlib
from dataclasses import dataclass, replace

from ..config import ArchConfig
from ..errors import ResourceError, UsageError

__all__ = ["at_clock", "Family", "Board", "FAMILIES", "BOARDS", "get_board"]


@dataclass(frozen=True)
class Family:
    """How an FPGA family implements the accelerator's multipliers and memories.

    ``mults_per_dsp``: 8x8 multipliers one DSP block holds as Yosys/the vendor tool maps them
    (one per block: Yosys never packs two 8x8 products into one SB_MAC16 by itself);
    ``dsps_per_wide_mult``: DSP blocks of one 32x32 requantization multiplier as the tool
    maps it (the compact datapath's); the five-stage one has its own 18x18 multipliers
    (``hdl/post.WIDE_MULT_BLOCKS``, fewer blocks where this is fewer);
    ``block_bits`` and ``block_widths``: one block RAM's capacity and its data widths;
    ``luts_per_pe``: logic cells of one PE beside its multiplier, ``luts_base``: the
    controller, post-processor and host link;
    ``luts_per_mult``: logic cells of one 8x8 multiplier built from logic, nonzero for families
    whose board builds keep the PE multipliers out of the DSP blocks (iCE40: its 8 SB_MAC16
    are kept for the requantizers, the products go through Yosys's ``booth`` pass);
    ``spill_luts``: logic cells of one 8x8 product built from adders
    (:func:`~hwonnx.hdl.dsp.logic_product`) for a PE beyond the DSP blocks the requantizers
    and element-wise lanes leave (ECP5: 37 CCU2C of two cells each and no LUT4, measured with
    Yosys, ``tests/hdl/test_hdl_dsp_split.py``; the open flow maps the rest of the products to
    MULT18X18D); 0: the fit check refuses such an array;
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
    spill_luts: int = 0
    huge_bits: int = 0
    huge_width: int = 0


FAMILIES = {f.name: f for f in [
    Family("ice40", "Yosys + nextpnr-ice40 (YoWASP)", 1, 4, 4096, (16, 8, 4, 2), 60, 3600, True,
           luts_per_mult=150, huge_bits=262144, huge_width=16),
    Family("ecp5", "Yosys + nextpnr-ecp5 (YoWASP)", 1, 4, 18432, (36, 18, 9), 70, 4000, True,
           spill_luts=74),
    Family("xilinx7", "Vivado", 1, 4, 36864, (72, 36, 18, 9), 45, 3000, False),
    Family("cyclonev", "Quartus", 3, 2, 10240, (40, 20, 10), 45, 3000, False),
    Family("gowin", "Yosys + nextpnr-himbaechel + Apicula (YoWASP)", 1, 4, 18432, (36, 18, 9),
           70, 4000, True),
]}


@dataclass(frozen=True)
class Board:
    """A target board: its amaranth-boards platform (pinout, clocks, toolchain scripts) and
    the capacities the fit check and the compiler use."""
    name: str
    description: str
    platform_path: str           # "module:Class" in amaranth_boards, or "hwonnx.module:Class"
    #                              for a platform hwonnx completes; "" for simulation
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
    ext_memory: str = ""         # its external memory with a controller hwonnx builds
    #                              (hwonnx/memories.py: MEMORIES, boards/litedram.py: CONTROLLERS)

    @property
    def is_simulation(self) -> bool:
        return not self.platform_path

    def platform(self):
        """A new instance of the board's platform class (Gowin: with the open flow's
        nextpnr-himbaechel, :func:`hwonnx.boards.platforms.himbaechel`)."""
        module, _, cls = self.platform_path.partition(":")
        if not module.startswith("hwonnx."):
            module = f"amaranth_boards.{module}"
        platform_class = getattr(importlib.import_module(module), cls)
        if self.family == "gowin":
            from .platforms import himbaechel
            platform_class = himbaechel(platform_class)
        return platform_class()

    @property
    def family_info(self) -> Family:
        return FAMILIES[self.family]


def _cfg(rows, cols, act, wgt, acc, par, prog, clock, prog_width=0, lut_tables=4,
         walker=True, mul_stages=5) -> ArchConfig:
    # the element-wise engine where the compiler can use it (cols >= rows)
    return ArchConfig(rows=rows, cols=cols, act_depth=act, wgt_depth=wgt, acc_depth=acc,
                      par_depth=par, prog_depth=prog, clock_hz=clock, prog_width=prog_width,
                      lut_tables=lut_tables, walker=walker, eltwise=cols >= rows,
                      mul_stages=mul_stages)


# Device capacities, from the vendors' data sheets:
# - iCE40 UP5K: iCE40 UltraPlus Family Data Sheet (FPGA-DS-02008), Table 1.1: 5280 LUTs,
#   30 EBR of 4 kbit (120 kbit), 8 DSP blocks, 4 SPRAM blocks of 256 kbit.
# - ECP5: ECP5 and ECP5-5G Family Data Sheet (FPGA-DS-02012), Table 1.1: LFE5U-25F 24K LUTs,
#   56 EBR of 18 kbit (1008 kbit), 28 18x18 multipliers; LFE5U-85F / LFE5UM5G-85F 84K LUTs,
#   208 EBR (3744 kbit), 156 multipliers. The LUT counts are the exact ones nextpnr-ecp5
#   reports (TRELLIS_COMB 24288 and 83640).
# - Gowin: GW1NR series data sheet (DS117): GW1NR-9 8640 LUT4s, 26 BSRAM blocks of 18 kbit
#   (468 kbit), 20 18x18 multipliers; GW2A series data sheet (DS102): GW2A-18 20736 LUT4s,
#   46 BSRAM (828 kbit), 48 multipliers.
# - Xilinx 7 series: Artix-7 (DS180) XC7A35T 20800 LUTs, 90 DSP48E1, 50 block RAMs of 36 kbit
#   (1800 kbit); XC7A100T 63400 LUTs, 240 DSPs, 135 block RAMs (4860 kbit). Zynq-7000 (DS190):
#   XC7Z010 17600 LUTs, 80 DSPs, 60 block RAMs (2160 kbit); XC7Z020 53200 LUTs, 220 DSPs,
#   140 block RAMs (5040 kbit).
#
# Default architectures that fit, by device (``check_fits``; tests/boards/test_boards.py checks
# each):
# UP5K: no tile walker (its 1,250 flip-flops do not fit beside the array), so every tile is
# stored, in the SPRAMs.
# The multiply of the requantizer in one stage (mul_stages): the five-stage one's
# flip-flops do not fit, and 12 MHz does not need it.
_UP5K = _cfg(4, 1, 512, 4096, 64, 64, 2304, 12_000_000, prog_width=64, lut_tables=2,
             walker=False, mul_stages=1)
# 25F: 28 multipliers hold 4x3 (12 products + 3 requantizers of 3).
_ECP5_25F = _cfg(4, 3, 2048, 2048, 256, 64, 512, 25_000_000)
_ECP5_85F = _cfg(8, 8, 4096, 4096, 1024, 128, 1024, 25_000_000)
# GW1NR-9: 20 multipliers hold 6x2 (12 + 2 requantizers of 4); its 26 block RAMs hold a
# 512-instruction program (12 blocks, 36 bits wide) and the data buffers, with no room left
# for the activation tables (two more blocks).
_GW1NR_9 = _cfg(6, 2, 512, 2048, 128, 32, 512, 27_000_000, lut_tables=0, mul_stages=1)
_GW2A_18 = _cfg(4, 4, 2048, 2048, 256, 64, 512, 27_000_000)
_XC7Z010 = _cfg(6, 6, 2048, 2048, 512, 64, 512, 33_333_000)

BOARDS = {board.name: board for board in [
    Board("sim", "no board: cycle-accurate Verilator simulation", "", "ecp5", 0, 0, 0,
          ArchConfig(), 50_000_000),
    # iCE40 UP5K: the program (7 words of 64 bits per instruction) lives in the four SPRAMs
    # and is loaded over the UART; the block RAMs hold weights, parameters and activations.
    # One column: the 8 DSPs make two 32x32 requantizers, but the logic holds only one. Two
    # activation tables fill one more block RAM.
    Board("icebreaker", "1BitSquared iCEBreaker, Lattice iCE40 UP5K", "icebreaker:"
          "ICEBreakerPlatform", "ice40", 8, 120, 5280, _UP5K, 12_000_000, huge_rams=4),
    Board("icesugar", "MuseLab iCESugar v1.5, Lattice iCE40 UP5K", "icesugar:ICESugarPlatform",
          "ice40", 8, 120, 5280, _UP5K, 12_000_000, huge_rams=4),
    Board("upduino-v3", "tinyVision.ai UPduino v3.0, Lattice iCE40 UP5K (12 MHz OSC jumper "
          "soldered; UART on header pins 3/4)", "hwonnx.boards.platforms:UpduinoV3UARTPlatform",
          "ice40", 8, 120, 5280, _UP5K, 12_000_000, huge_rams=4),
    # ECP5
    Board("ulx3s-85f", "Radiona ULX3S, Lattice ECP5 LFE5U-85F", "ulx3s:ULX3S_85F_Platform",
          "ecp5", 156, 3744, 83640, _ECP5_85F, 25_000_000, ext_memory="ulx3s-sdram"),
    Board("ecpix5-85", "LambdaConcept ECPIX-5, Lattice ECP5 LFE5UM5G-85F",
          "ecpix5:ECPIX585Platform", "ecp5", 156, 3744, 83640, _ECP5_85F, 25_000_000, pll=True,
          ext_memory="ecpix5-ddr3"),
    Board("orangecrab-85f", "Good Stuff Department OrangeCrab r0.2, Lattice ECP5 LFE5U-85F "
          "(UART on Feather pins 0/1)", "hwonnx.boards.platforms:OrangeCrab85FUARTPlatform",
          "ecp5", 156, 3744, 83640, replace(_ECP5_85F, clock_hz=24_000_000), 24_000_000,
          pll=True),
    Board("ulx3s-25f", "Radiona ULX3S, Lattice ECP5 LFE5U-25F", "ulx3s:ULX3S_25F_Platform",
          "ecp5", 28, 1008, 24288, _ECP5_25F, 25_000_000, ext_memory="ulx3s-sdram"),
    Board("orangecrab-25f", "Good Stuff Department OrangeCrab r0.2, Lattice ECP5 LFE5U-25F "
          "(UART on Feather pins 0/1)", "hwonnx.boards.platforms:OrangeCrab25FUARTPlatform",
          "ecp5", 28, 1008, 24288, replace(_ECP5_25F, clock_hz=24_000_000), 24_000_000,
          pll=True),
    Board("colorlight-5a-75b", "Colorlight 5A-75B v7.0, Lattice ECP5 LFE5U-25F",
          "colorlight_5a75b_r7_0:Colorlight_5A75B_R70Platform", "ecp5", 28, 1008, 24288,
          _ECP5_25F, 25_000_000),
    Board("icesugar-pro", "MuseLab iCESugar-Pro, Lattice ECP5 LFE5U-25F",
          "icesugar_pro:ICESugarProPlatform", "ecp5", 28, 1008, 24288, _ECP5_25F, 25_000_000),
    # Gowin
    Board("tang-primer-20k", "Sipeed Tang Primer 20K, Gowin GW2A-18", "tang_primer_20k:"
          "TangPrimer20kPlatform", "gowin", 48, 828, 20736, _GW2A_18, 27_000_000),
    Board("tang-nano-9k", "Sipeed Tang Nano 9K, Gowin GW1NR-9", "tang_nano_9k:"
          "TangNano9kPlatform", "gowin", 20, 468, 8640, _GW1NR_9, 27_000_000),
    # Xilinx 7 series and Zynq-7000 (the programmable logic only)
    Board("arty-a7-35", "Digilent Arty A7-35T, Xilinx Artix-7 XC7A35T",
          "arty_a7:ArtyA7_35Platform", "xilinx7", 90, 1800, 20800,
          _cfg(8, 6, 2048, 2048, 512, 64, 512, 40_000_000), 40_000_000, pll=True,
          ext_memory="arty-ddr3"),
    Board("arty-a7-100", "Digilent Arty A7-100T, Xilinx Artix-7 XC7A100T",
          "arty_a7:ArtyA7_100Platform", "xilinx7", 240, 4860, 63400,
          _cfg(12, 12, 4096, 4096, 1024, 128, 1024, 40_000_000), 40_000_000, pll=True,
          ext_memory="arty-ddr3"),
    Board("arty-z7-20", "Digilent Arty Z7-20 (Pynq-Z1 class), Xilinx Zynq XC7Z020 (UART: "
          "Pmod USBUART on JA)", "hwonnx.boards.platforms:ArtyZ720UARTPlatform", "xilinx7",
          220, 5040, 53200, _cfg(12, 12, 4096, 4096, 1024, 128, 1024, 40_000_000), 40_000_000,
          pll=True),
    # The EBAZ4205 runs at its 33.333 MHz oscillator: the MMCM recipe of clocks.py needs a
    # divider in steps of 1/8, which 33.333 MHz to 40 MHz does not give.
    Board("ebaz4205", "EBAZ4205 (mining control board), Xilinx Zynq XC7Z010",
          "ebaz4205:EBAZ4205Platform", "xilinx7", 80, 2160, 17600, _XC7Z010, 33_333_000),
    # Intel
    Board("de10-nano", "Terasic DE10-Nano, Intel Cyclone V 5CSEBA6", "de10_nano:"
          "DE10NanoPlatform", "cyclonev", 112, 5570, 83820,
          _cfg(12, 12, 4096, 4096, 1024, 128, 1024, 50_000_000), 50_000_000),
]}


def get_board(name: str) -> Board:
    if name not in BOARDS:
        raise ResourceError(f"Unknown board '{name}'; known boards are "
                            f"{', '.join(sorted(BOARDS))}")
    return BOARDS[name]


def at_clock(board: Board, clock_hz: int) -> Board:
    """``board`` with the accelerator's clock made by its PLL from the oscillator: the fastest
    the PLL makes of at most ``clock_hz`` (:func:`.clocks.pll_clock`); ``hwonnx build
    --clock``. Refused for the simulator and for a family this module sets no PLL of."""
    from .clocks import pll_clock
    if board.is_simulation:
        raise UsageError("--clock sets a board's PLL: it needs --board")
    if isinstance(clock_hz, bool) or not isinstance(clock_hz, int) or clock_hz <= 0:
        raise UsageError(f"The clock must be a positive number of hertz, not {clock_hz!r}")
    source_hz = int(board.platform().default_clk_frequency)
    try:
        made = pll_clock(board.family, source_hz, clock_hz)
    except ValueError as error:
        raise UsageError(f"Board '{board.name}' cannot run at {clock_hz / 1e6:g} MHz: "
                         f"{error}") from None
    return replace(board, clock_hz=made, pll=True)


def with_clock(board: Board, config: ArchConfig) -> ArchConfig:
    """``config`` with the board's accelerator clock."""
    return replace(config, clock_hz=board.clock_hz)
