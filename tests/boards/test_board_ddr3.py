"""The DDR3 memories (boards/litedram.py, boards/dram_init.py, boards/dram.py): LiteDRAM from
PyPI generates the ECPIX-5's ECP5 controller and the Arty A7's Artix-7 one for the boards'
pins; the sequencer levels their reads as LiteDRAM's BIOS does, against a model of the PHY
whose reads come back right only at some bitslips and delays; the clock-domain crossing
carries host writes and burst reads between the accelerator's clock and the controller's,
at unrelated frequencies."""

import re
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from hwonnx.boards.dram import NativeBridge, NativePortCDC
from hwonnx.boards.dram_init import DramInit
from hwonnx.boards.litedram import (DFII, generate_controller, handover_writes, init_writes,
                                    read_leveling)

from hdl_helpers import run_cycles
from boards_helpers import NativePort, bios_writes


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return generate_controller("ecpix5-ddr3", 25_000_000, 64, "LFE5UM5G-85F-8BG554C",
                               tmp_path_factory.mktemp("litedram"))


@pytest.fixture(scope="module")
def arty(tmp_path_factory):
    # The Arty A7-35's 8x6 array: 48-bit words, on a 64-bit port.
    return generate_controller("arty-ddr3", 40_000_000, 48, "xc7a35ticsg324-1L",
                               tmp_path_factory.mktemp("litedram"))


def test_litedram_generates_the_ecpix5_ddr3_controller(core):
    verilog = core.verilog.read_text()
    for port in (r"inout\s+wire\s+\[15:0\] ddram_dq,", r"inout\s+wire\s+\[1:0\] ddram_dqs_p,",
                 r"output\s+wire\s+\[14:0\] ddram_a,", r"input\s+wire\s+clk,",
                 r"output\s+wire\s+user_clk,", r"output\s+wire\s+\[31:0\] wb_ctrl_dat_r"):
        assert re.search(port, verilog), port
    # The board ties the DDR3's chip select and reset: the core has no such pins.
    assert not re.search(r"ddram_(cs_n|reset_n)", verilog)
    # 512 MB in words of 8 bytes: 26 address bits; the PHY's own clocks (50 MHz, DDR3-200).
    assert (core.port_addr_bits, core.port_data_bits, core.own_clock) == (26, 64, True)
    assert "sys_clk_freq\": 50000000" in (core.verilog.parent / "litedram.json").read_text()
    lv = read_leveling(core)
    assert (lv.modules, lv.databits, lv.nphases, lv.phase_bits, lv.bitslips, lv.delays) == \
        (2, 16, 2, 64, 4, 8)
    assert lv.burst_detect and lv.words["sdram_dfii_pi1_wrdata"] == 2
    assert [lv.lane_mask(m) for m in (0, 1)] == [0x00FF00FF, 0xFF00FF00]


def test_ddr3_init_writes_are_litedram_bios_init_sequence(core):
    bios, csr, bits = bios_writes(core.verilog.parent)
    assert len(bios) == 2 * 3 + 5 * 4    # reset released, CKE high, then five commands
    assert init_writes(core, handover=False) == bios
    assert handover_writes(core, error=True) == [
        (csr["sdram_dfii_control"], bits["DFII_CONTROL_SEL"], 0),
        (csr["ddrctrl_init_error"], 1, 0), (csr["ddrctrl_init_done"], 1, 0)]


class _PhyModel:
    """The control bus of a LiteDRAM core on an ECP5 DDR3 PHY, with the memory behind it: a
    lane's read data (and its burst detection) is right only at the bitslips and delays
    ``good[lane]`` lists. Acknowledges each access 0 to 2 cycles late."""

    def __init__(self, init, lv, good, rng):
        self.init, self.lv, self.good, self.rng = init, lv, good, rng
        self.names = {a: n for n, a in lv.reg.items()}
        for name, n in lv.words.items():
            for i in range(1, n):
                self.names[lv.reg[name] + i] = f"{name}+{i}"
        self.writes, self.sel, self.seen = [], 0, 0
        self.bitslip, self.delay = [0] * lv.modules, [0] * lv.modules
        self.regs, self.stored, self.read = {}, None, [0] * lv.nphases
        self.ack_at = None

    def _phase_value(self, prefix, p):
        n = self.lv.words[f"sdram_dfii_pi{p}_{prefix}"]
        return sum(self.regs.get(f"sdram_dfii_pi{p}_{prefix}" + (f"+{i}" if i else ""), 0)
                   << (32 * (n - 1 - i)) for i in range(n))

    def _write(self, name, value):
        lv = self.lv
        self.regs[name] = value
        lanes = [m for m in range(lv.modules) if self.sel >> m & 1]
        # the selected lanes' delay or bitslip: reset, or one step (wrapping)
        steps = {"ddrphy_rdly_dq_rst": (self.delay, 0), "ddrphy_rdly_dq_inc": (self.delay, 1),
                 "ddrphy_rdly_dq_bitslip_rst": (self.bitslip, 0),
                 "ddrphy_rdly_dq_bitslip": (self.bitslip, 1)}
        if name == "ddrphy_dly_sel":
            self.sel = value
        elif name in steps:
            setting, step = steps[name]
            count = lv.delays if setting is self.delay else lv.bitslips
            for m in lanes:
                setting[m] = (setting[m] + 1) % count if step else 0
        elif name == "ddrphy_burstdet_clr":
            self.seen = 0
        elif (found := re.fullmatch(r"sdram_dfii_pi(\d)_command_issue", name)):
            phase = int(found.group(1))
            command = self.regs[f"sdram_dfii_pi{phase}_command"]
            if command & DFII["DFII_COMMAND_WRDATA"]:
                assert phase == lv.wrphase
                self.stored = [self._phase_value("wrdata", p) for p in range(lv.nphases)]
            if command & DFII["DFII_COMMAND_RDDATA"]:
                assert phase == lv.rdphase and self.stored is not None
                right = [self.delay[m] in self.good[m].get(self.bitslip[m], ()) for m in
                         range(lv.modules)]
                self.seen = sum(1 << m for m in range(lv.modules) if right[m])
                wrong = sum(lv.lane_mask(m) * 0x100000001 for m in range(lv.modules)
                            if not right[m]) & ((1 << lv.phase_bits) - 1)
                self.read = [value ^ (wrong & 0x5A5A5A5A5A5A5A5A) for value in self.stored]

    def _read(self, name):
        lv = self.lv
        if name == "ddrphy_burstdet_seen":
            return self.seen
        found = re.fullmatch(r"sdram_dfii_pi(\d)_rddata(?:\+(\d))?", name)
        assert found, name
        n, i = lv.words[f"sdram_dfii_pi{found.group(1)}_rddata"], int(found.group(2) or 0)
        return self.read[int(found.group(1))] >> (32 * (n - 1 - i)) & 0xFFFFFFFF

    def step(self, ctx, cycle, dut):
        ctx.set(dut.ack, 0)
        if not (ctx.get(dut.cyc) and ctx.get(dut.stb)):
            return
        if self.ack_at is None:
            self.ack_at = cycle + int(self.rng.integers(0, 3))
        if cycle < self.ack_at:
            return
        self.ack_at = None
        adr = ctx.get(dut.adr)
        if ctx.get(dut.we):
            self.writes.append((adr, ctx.get(dut.dat_w)))
            if len(self.writes) > len(self.init):
                self._write(self.names[adr], ctx.get(dut.dat_w))
        else:
            ctx.set(dut.dat_r, self._read(self.names[adr]))
        ctx.set(dut.ack, 1)


def _level(core, good, cycles, **smaller):
    lv = replace(read_leveling(core), **smaller)
    init = [(a, d, min(w, 20)) for a, d, w in init_writes(core, handover=False)]
    dut = DramInit(init, lv, handover_writes(core), handover_writes(core, error=True))
    phy = _PhyModel(init, lv, good, np.random.default_rng(5))
    state = {"done": None}

    def step(ctx, cycle):
        phy.step(ctx, cycle, dut)
        if ctx.get(dut.done) and state["done"] is None:
            state["done"] = (cycle, ctx.get(dut.error))

    run_cycles(dut, cycles, step)
    assert state["done"] is not None, "the sequencer did not finish"
    assert phy.writes[:len(init)] == [(a, d) for a, d, _ in init]
    return phy, state["done"][1]


def test_read_leveling_picks_the_widest_bitslip_and_centres_its_delay(core):
    # Lane 0: bitslips 1 and 2 work at four delays each (0-3, 3-6), bitslip 3 at two: the
    # first of the tie, bitslip 1, delay 1 (BIOS: a later bitslip must score higher).
    # Lane 1: bitslip 0 works at six delays in two runs (0-1, 4-7), bitslip 3 at five
    # (1-5): bitslip 0 by the count, delay 5, the middle of its longest run.
    good = [{1: {0, 1, 2, 3}, 2: {3, 4, 5, 6}, 3: {6, 7}},
            {0: {0, 1, 4, 5, 6, 7}, 3: {1, 2, 3, 4, 5}}]
    phy, error = _level(core, good, 90_000)
    assert not error
    assert (phy.bitslip, phy.delay) == ([1, 0], [1, 5])
    reg = {n: a for n, a in read_leveling(core).reg.items()}
    assert phy.writes[-2:] == [(reg["sdram_dfii_control"], DFII["DFII_CONTROL_SEL"]),
                               (reg["ddrctrl_init_done"], 1)]


def test_read_leveling_without_a_working_delay_keeps_the_port_closed(core):
    phy, error = _level(core, [{1: {2, 3}}, {}], 90_000)
    assert error
    reg = read_leveling(core).reg
    assert phy.writes[-3:] == [(reg["sdram_dfii_control"], DFII["DFII_CONTROL_SEL"]),
                               (reg["ddrctrl_init_error"], 1), (reg["ddrctrl_init_done"], 1)]


def test_litedram_generates_the_arty_ddr3_controller(arty):
    verilog = arty.verilog.read_text()
    for port in (r"inout\s+wire\s+\[1:0\] ddram_dqs_n,", r"output\s+wire\s+ddram_reset_n,",
                 r"output\s+wire\s+ddram_clk_n,", r"\bISERDESE2\b", r"\bIDELAYE2\b"):
        assert re.search(port, verilog), port
    # 256 MB in words of 8 bytes (six of the array's, padded): 25 address bits.
    assert (arty.port_addr_bits, arty.port_data_bits, arty.own_clock) == (25, 64, True)
    lv = read_leveling(arty)
    assert (lv.modules, lv.nphases, lv.phase_bits, lv.rdphase, lv.wrphase, lv.bitslips,
            lv.delays, lv.burst_detect) == (2, 4, 32, 2, 3, 8, 32, False)
    bios, csr, _ = bios_writes(arty.verilog.parent)
    # The BIOS's sdram_init() pulses the PHY's reset before init_sequence().
    assert init_writes(arty, handover=False) == [
        (csr["ddrphy_rst"], 1, 1000), (csr["ddrphy_rst"], 0, 1000)] + bios


def test_read_leveling_of_the_artix7_phy(arty):
    """Four phases of one 32-bit word, read phase 2, write phase 3, no burst detection
    (fewer bitslips and delays than its 8 and 32, for the simulator's sake)."""
    good = [{1: {2, 3, 4}, 3: {0, 5}}, {2: {5, 6, 7}}]
    phy, error = _level(arty, good, 200_000, bitslips=4, delays=8)
    assert not error
    assert (phy.bitslip, phy.delay) == ([1, 2], [3, 6])


class _Crossing(Elaboratable):
    """The board's bridge and crossing: the host side in ``sync``, the native port in
    ``dram``."""

    def __init__(self):
        self.bridge = NativeBridge(64, 26, burst=16)
        self.cdc = NativePortCDC(64, 26, depth=32)

    def elaborate(self, platform):
        m = Module()
        m.submodules.bridge, m.submodules.cdc = self.bridge, self.cdc
        wiring.connect(m, self.bridge.port, self.cdc.up)
        return m


@pytest.mark.parametrize("dram_period", [17e-9, 97e-9])
def test_the_crossing_carries_writes_and_bursts_between_the_clocks(dram_period):
    """Against a native port at random speed in the controller's clock, faster or slower
    than the accelerator's: every host write lands, every burst read returns its words in
    order. The port stalls its read data for 200 of every 400 of its cycles, so commands pile
    up and their data then comes back to back: the read-data FIFO must not overflow."""
    rng = np.random.default_rng(7)
    dut = _Crossing()
    bridge = dut.bridge
    port = NativePort(SimpleNamespace(port=dut.cdc.down), rng, stall=200)
    words = {int(a): int(rng.integers(0, 1 << 63)) for a in rng.choice(300, 40, replace=False)}
    to_write = list(words.items())
    reads = [(int(a), 16) for a in rng.integers(0, 280, 16)] + [(5, 3), (90, 1)]
    expected = [words.get(a + i, 0) for a, n in reads for i in range(n)]
    got = []

    async def host(ctx):
        w = r = 0
        for _ in range(4000):
            ctx.set(bridge.ext.wr_valid, int(w < len(to_write)))
            ctx.set(bridge.ext.cmd_valid, 0)
            if w < len(to_write):
                ctx.set(bridge.ext.wr_addr, to_write[w][0])
                ctx.set(bridge.ext.wr_data, to_write[w][1])
                w += ctx.get(bridge.ext.wr_ready)
            elif r < len(reads):
                ctx.set(bridge.ext.cmd_valid, 1)
                ctx.set(bridge.ext.cmd_addr, reads[r][0])
                ctx.set(bridge.ext.cmd_len, reads[r][1])
                r += ctx.get(bridge.ext.cmd_ready)
            if ctx.get(bridge.ext.rvalid):
                got.append(ctx.get(bridge.ext.rdata))
            await ctx.tick("sync")

    async def memory(ctx):
        cycle = 0
        while True:
            port.step(ctx, cycle)
            await ctx.tick("dram")
            cycle += 1

    sim = Simulator(dut)
    sim.add_clock(40e-9, domain="sync")
    sim.add_clock(dram_period, domain="dram")
    sim.add_testbench(host)
    sim.add_testbench(memory, background=True)
    sim.run()
    assert port.writes == [a for a, _ in to_write]
    assert got == expected
