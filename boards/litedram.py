"""The external memory's controller on a board: a LiteDRAM standalone core (``litedram`` from
PyPI, generated in its own process by ``boards/litedram_gen.py``), and the list of control-bus
writes that initializes the memory the way LiteDRAM's BIOS does, which the board design runs
itself (``boards/dram.py: DramInit``) because the core has no CPU."""

import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import ToolchainError
from ..memories import port_bytes
from .dram_init import DFII, ReadLeveling

__all__ = ["CONTROLLERS", "DramCore", "generate_controller", "init_writes",
           "handover_writes", "read_leveling", "DFII"]

#: LiteDRAM settings of each external memory (``hwonnx/memories.py: MEMORIES``):
#: - the ULX3S's IS42S16160 (32 MB, 16 bits: two byte lanes) on LiteDRAM's generic SDR PHY,
#:   clocked by the accelerator's clock;
#: - the ECPIX-5's MT41K256M16 (512 MB DDR3, 16 bits) on LiteDRAM's ECP5 DDR3 PHY, which
#:   makes its own clocks from the board's 100 MHz oscillator: 50 MHz for the controller
#:   (``sys_clk_freq``; the DDR3 runs at 100 MHz, as LiteX's ECPIX-5 target at 50 MHz),
#:   crossed to the accelerator's clock (``boards/dram.py: NativePortCDC``). The board ties
#:   the DDR3's ``cs_n`` and ``reset_n``; ODT and drive strength as LiteX's ECP5 targets.
#: - the Arty A7's MT41K128M16 (256 MB DDR3, 16 bits) on LiteDRAM's Artix-7 PHY (1:4, its
#:   ISERDES/OSERDES and IDELAYs: Vivado builds it), at 100 MHz from the board's 100 MHz
#:   oscillator as LiteX's Arty target, crossed to the accelerator's clock likewise.
#: ``luts``: logic cells of the external memory's path: the DMA engine, the controller, its
#: sequencer and bridge (``boards/fit.py``; bench/results/boards.md: KWS on the ULX3S-85F has
#: 18,514 with the SDRAM's, 17,125 without; on the ECPIX-5 with the DDR3's, 22,555: 4,041 more
#: than with the SDRAM's. The Arty's is not measured: Vivado).
CONTROLLERS = {
    "ulx3s-sdram": {"memtype": "SDR", "sdram_module": "IS42S16160", "sdram_module_nb": 2,
                    "sdram_rank_nb": 1, "sdram_phy": "GENSDRPHY", "cmd_buffer_depth": 16,
                    "luts": 1400},
    "arty-ddr3": {"memtype": "DDR3", "sdram_module": "MT41K128M16", "sdram_module_nb": 2,
                  "sdram_rank_nb": 1, "sdram_phy": "A7DDRPHY", "cmd_buffer_depth": 16,
                  "sys_clk_freq": 100_000_000, "input_clk_freq": 100_000_000,
                  "iodelay_clk_freq": 200_000_000, "cmd_latency": 0, "speedgrade": -1,
                  "rtt_nom": "60ohm", "rtt_wr": "60ohm", "ron": "34ohm", "luts": 5400},
    "ecpix5-ddr3": {"memtype": "DDR3", "sdram_module": "MT41K256M16", "sdram_module_nb": 2,
                    "sdram_rank_nb": 1, "sdram_phy": "ECP5DDRPHY", "cmd_buffer_depth": 16,
                    "sys_clk_freq": 50_000_000, "input_clk_freq": 100_000_000,
                    "init_clk_freq": 25_000_000, "rtt_nom": "60ohm", "rtt_wr": "60ohm",
                    "ron": "34ohm", "omit_pads": ["cs_n", "reset_n"], "luts": 5400},
}

@dataclass(frozen=True)
class DramCore:
    """A generated controller: its Verilog module and what the design around it needs."""
    memory: str                      # the memory's name (CONTROLLERS)
    module: str
    verilog: Path
    registers: "dict[str, int]"      # control register -> byte address on the control bus
    init: "list[list]"               # LiteDRAM's init steps: comment, a, ba, command, delay
    port_addr_bits: int              # the native user port: address in words of ...
    port_data_bits: int              # ... this many bits (a weight word, padded to a power
    #                                  of two: hdl/extmem.py, port_bytes)
    phy: "dict[str, object]"         # the PHY's settings (``PhySettings``): type, data bits,
    #                                  phases, read/write phase, read leveling's bitslips, delays
    register_words: "dict[str, int]"  # control register -> its 32-bit words (most significant
    #                                   first, LiteX's CSR order)

    @property
    def word_addresses(self) -> "dict[str, int]":
        """Control register -> its word address (the sequencer's Wishbone addresses)."""
        return {name: address // 4 for name, address in self.registers.items()}

    @property
    def own_clock(self) -> bool:
        """The core makes its clocks from the board's oscillator (a DDR PHY) instead of
        running on the accelerator's."""
        return self.phy["phytype"] != "GENSDRPHY"


def generate_controller(memory: str, clock_hz: int, word_bits: int, device: str,
                        folder: Path, name: str = "hwonnx_dram") -> DramCore:
    """Generate the controller of ``memory`` for the ECP5 ``device`` (``LFE5U-85F-6BG381C``)
    at ``clock_hz`` (a DDR controller at its own ``sys_clk_freq``), its user port
    ``word_bits`` wide, into ``folder``."""
    if memory not in CONTROLLERS:
        raise ToolchainError(f"No controller is known for the external memory '{memory}'")
    if importlib.util.find_spec("litedram") is None:
        raise ToolchainError("The external memory's controller is generated by LiteDRAM: "
                             "pip install -e \".[bitstream]\" (litedram, litex, migen)")
    folder.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in CONTROLLERS[memory].items() if k != "luts"}
    port_bits = 8 * port_bytes(word_bits // 8)       # a word each, padded to a power of two
    config = {"name": name, "sys_clk_freq": clock_hz, **settings, "device": device,
              "user_ports": {"dma": {"type": "native", "data_width": port_bits}}}
    (folder / "litedram.json").write_text(json.dumps(config, indent=1))
    done = subprocess.run([sys.executable, "-m", "hwonnx.boards.litedram_gen",
                           str(folder / "litedram.json"), str(folder)],
                          capture_output=True, text=True)
    if done.returncode:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ToolchainError(f"LiteDRAM could not generate the controller of '{memory}': "
                             f"{tail}")
    core = json.loads((folder / "core.json").read_text())
    return DramCore(memory, core["module"], folder / f"{name}.v", core["registers"],
                    core["init"], core["port_addr_bits"], core["port_data_bits"], core["phy"],
                    core["register_words"])


def _bits(names: str) -> int:
    value = 0
    for name in names.split("|"):
        value |= DFII[name]
    return value


def init_writes(core: DramCore, handover: bool = True) -> "list[tuple[int, int, int]]":
    """The control-bus writes that initialize the memory, as ``(word address, data, cycles to
    wait after it)``: LiteDRAM's BIOS ``init_sequence()`` (``litedram/init.py``), each
    ``cdelay(n)`` taken as ``n`` cycles; then (``handover``: :func:`handover_writes`) the
    controller takes the memory over."""
    reg = core.word_addresses
    writes = []
    if "ddrphy_rst" in reg:              # the BIOS's sdram_init() resets such a PHY first
        writes += [(reg["ddrphy_rst"], 1, 1000), (reg["ddrphy_rst"], 0, 1000)]
    for _, a, ba, command, delay in core.init:
        writes += [(reg["sdram_dfii_pi0_address"], a, 0),
                   (reg["sdram_dfii_pi0_baddress"], ba, 0)]
        if command.startswith("DFII_CONTROL"):
            writes.append((reg["sdram_dfii_control"], _bits(command), delay))
        else:
            writes += [(reg["sdram_dfii_pi0_command"], _bits(command), 0),
                       (reg["sdram_dfii_pi0_command_issue"], 1, delay)]
    return writes + (handover_writes(core) if handover else [])


def read_leveling(core: DramCore) -> "ReadLeveling | None":
    """What :class:`~hwonnx.boards.dram_init.DramInit` needs to level the reads of ``core``'s
    PHY, or ``None`` for a PHY without read leveling (SDR)."""
    phy = core.phy
    if not phy.get("read_leveling"):
        return None
    if phy.get("write_leveling") or phy.get("write_latency_calibration"):
        raise ToolchainError(f"The {phy['phytype']} PHY needs its writes calibrated, which "
                             f"hwonnx's sequencer does not do (boards/dram_init.py)")
    return ReadLeveling(
        reg=core.word_addresses,
        words=dict(core.register_words), modules=phy["databits"] // 8,
        databits=phy["databits"], nphases=phy["nphases"], phase_bits=phy["dfi_databits"],
        rdphase=phy["rdphase"], wrphase=phy["wrphase"], bitslips=phy["bitslips"],
        delays=phy["delays"], burst_detect="ddrphy_burstdet_seen" in core.registers)


def handover_writes(core: DramCore, error: bool = False) -> "list[tuple[int, int, int]]":
    """The controller takes the memory over (``DFII_CONTROL_SEL``) and ``ddrctrl_init_done``
    opens the user port; with ``error``, ``ddrctrl_init_error`` first keeps it closed (the
    BIOS's failed memory test)."""
    reg = core.word_addresses
    return [(reg["sdram_dfii_control"], DFII["DFII_CONTROL_SEL"], 0)] \
        + ([(reg["ddrctrl_init_error"], 1, 0)] if error else []) \
        + [(reg["ddrctrl_init_done"], 1, 0)]
