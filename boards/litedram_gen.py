"""Run in its own process (``python -m hwonnx.boards.litedram_gen CONFIG OUT``): LiteDRAM's
standalone core generator (``litedram.gen``) for one memory, with no CPU, a Wishbone control
bus and one native user port; writes ``OUT/<name>.v`` and ``OUT/core.json``: the control
registers' addresses and sizes, the memory's initialization sequence as LiteDRAM's own BIOS would
run it (``litedram.init``), the PHY's read-leveling settings and the user port's widths. The
config's ``omit_pads`` names memory pins the board does not route (the ECPIX-5 ties its DDR3's
``cs_n`` and ``reset_n``): the core is generated without them, as LiteDRAM's PHYs allow. A
separate process keeps Migen and LiteX out of hwonnx's (``boards/litedram.py`` reads the
result)."""

import csv
import json
import re
import sys
from pathlib import Path

__all__ = ["main"]


def main(config_path: str, out_dir: str) -> None:
    from litedram import gen, modules, phy
    from litedram.gen import LiteDRAMCore
    from litedram.init import get_sdram_phy_init_sequence
    from litex.build.lattice import LatticePlatform
    from litex.soc.integration.builder import Builder

    config = json.loads(Path(config_path).read_text())
    name = config.pop("name")
    omit = set(config.pop("omit_pads", []))
    if omit:
        ios = gen.get_dram_ios
        gen.get_dram_ios = lambda core_config: [
            (pads[0], pads[1], *[s for s in pads[2:] if getattr(s, "name", None) not in omit])
            for pads in ios(core_config)]
    core_config = {**config, "cpu": None,
                   "sdram_module": getattr(modules, config["sdram_module"]),
                   "sdram_phy": getattr(phy, config["sdram_phy"]),
                   "sys_clk_freq": float(config["sys_clk_freq"])}
    out = Path(out_dir)
    if core_config["device"].startswith("xc7"):
        from litex.build.xilinx import XilinxPlatform
        platform = XilinxPlatform(core_config["device"], io=[], toolchain="vivado")
    else:
        platform = LatticePlatform(core_config["device"], io=[], toolchain="trellis")
    soc = LiteDRAMCore(platform, core_config, integrated_rom_size=0)
    builder = Builder(soc, output_dir=str(out / "litex"), compile_gateware=False,
                      compile_software=False, csr_csv=str(out / "csr.csv"))
    builder.build(build_name=name, regular_comb=False)
    verilog = (out / "litex" / "gateware" / f"{name}.v").read_text()
    # Migen declares the data (and strobe) pins, which only a TRELLIS_IO inside drives, as
    # inputs.
    verilog, changed = re.subn(r"\binput(\s+wire\s+\[\d+:0\]\s+(sdram_dq|ddram_dq|ddram_dqs_p),)",
                               r"inout\1", verilog)
    if changed != {"SDR": 1}.get(config["memtype"], 2) and not platform.device.startswith("xc7"):
        raise RuntimeError("litedram_gen: no data pins in the generated core")
    (out / f"{name}.v").write_text(verilog)

    def port_bits(signal: str) -> int:
        found = re.search(rf"\[(\d+):0\]\s+user_port_dma_{signal},", verilog)
        return int(found.group(1)) + 1

    registers, sizes = {}, {}
    with open(out / "csr.csv") as f:
        for row in csv.reader(line for line in f if not line.startswith("#")):
            if row[0] == "csr_register":
                registers[row[1]] = int(row[2], 16)
                sizes[row[1]] = int(row[3])
    phy_settings = (soc.sdrphy if hasattr(soc, "sdrphy") else soc.ddrphy).settings
    sequence, _ = get_sdram_phy_init_sequence(phy_settings,
                                              soc.sdram.controller.settings.timing)
    (out / "core.json").write_text(json.dumps({
        "module": name, "registers": registers, "register_words": sizes,
        "init": [[comment, a, ba, cmd, delay] for comment, a, ba, cmd, delay in sequence],
        "port_addr_bits": port_bits("cmd_addr"), "port_data_bits": port_bits("rdata_data"),
        "cl": phy_settings.cl,
        "phy": {key: _value(getattr(phy_settings, key, None)) for key in (
            "phytype", "databits", "dfi_databits", "nphases", "rdphase", "wrphase",
            "read_leveling", "write_leveling", "write_latency_calibration", "bitslips",
            "delays")},
    }, indent=1))


def _value(setting):
    """A PHY setting's value: a register's reset value for the ones software may change
    (the Xilinx PHYs' read and write phases)."""
    reset = getattr(setting, "reset", None)
    return getattr(reset, "value", reset) if reset is not None else setting


if __name__ == "__main__":
    main(*sys.argv[1:])
