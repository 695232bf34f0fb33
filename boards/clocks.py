"""Clock generation for boards whose oscillator is faster than the accelerator's clock."""

from amaranth.hdl import ClockDomain, ClockSignal, Instance, Module, Signal
from amaranth.lib import io
from amaranth.lib.cdc import ResetSynchronizer

__all__ = ["pll_domain"]


def pll_domain(m: Module, platform, family: str, clock_hz: int) -> Signal:
    """Create the ``sync`` domain at ``clock_hz`` from the board's default clock through the
    family's PLL, held in reset until the PLL locks; return the oscillator's clock (another
    PLL may take it too: a DDR memory controller's)."""
    pin = platform.request(platform.default_clk, dir="-")
    m.submodules.clk_buf = buf = io.Buffer("i", pin)
    source_hz = int(platform.default_clk_frequency)
    m.domains.sync = ClockDomain("sync")
    clk_out, locked = Signal(name="pll_clk"), Signal(name="pll_locked")
    if family == "ecp5":
        # fout = fin / CLKI_DIV * CLKFB_DIV; VCO = fout * CLKOP_DIV must lie in 400..800 MHz.
        fb_div, clki_div = _ratio(clock_hz, source_hz)
        op_div = max(1, -(-400_000_000 // clock_hz))
        m.submodules.pll = Instance(
            "EHXPLLL",
            a_FREQUENCY_PIN_CLKI=str(source_hz / 1e6), a_FREQUENCY_PIN_CLKOP=str(clock_hz / 1e6),
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_CLKOP_ENABLE="ENABLED",
            p_CLKI_DIV=clki_div, p_CLKFB_DIV=fb_div, p_CLKOP_DIV=op_div, p_CLKOP_CPHASE=op_div - 1,
            p_CLKOP_FPHASE=0, p_FEEDBK_PATH="CLKOP",
            i_CLKI=buf.i, i_CLKFB=clk_out, i_RST=0, i_STDBY=0, i_PHASESEL0=0, i_PHASESEL1=0,
            i_PHASEDIR=0, i_PHASESTEP=0, i_PHASELOADREG=0, i_PLLWAKESYNC=0, i_ENCLKOP=0,
            o_CLKOP=clk_out, o_LOCK=locked)
    elif family == "xilinx7":
        # VCO = fin * MULT must lie in 600..1200 MHz; fout = VCO / DIVIDE.
        mult = max(2, -(-600_000_000 // source_hz))
        divide = mult * source_hz / clock_hz
        feedback, unbuffered = Signal(), Signal()
        m.submodules.mmcm = Instance(
            "MMCME2_BASE", p_CLKIN1_PERIOD=1e9 / source_hz, p_CLKFBOUT_MULT_F=float(mult),
            p_DIVCLK_DIVIDE=1, p_CLKOUT0_DIVIDE_F=float(divide),
            i_CLKIN1=buf.i, i_CLKFBIN=feedback, o_CLKFBOUT=feedback, o_CLKOUT0=unbuffered,
            i_RST=0, i_PWRDWN=0, o_LOCKED=locked)
        m.submodules.bufg = Instance("BUFG", i_I=unbuffered, o_O=clk_out)
    else:
        raise NotImplementedError(f"No PLL recipe for the {family} family")
    m.d.comb += ClockSignal("sync").eq(clk_out)
    m.submodules.reset_sync = ResetSynchronizer(~locked, domain="sync")
    platform.add_clock_constraint(clk_out, clock_hz)
    return buf.i


def _ratio(target: int, source: int) -> "tuple[int, int]":
    """Smallest ``(mul, div)`` with ``source * mul / div == target``."""
    from math import gcd
    g = gcd(target, source)
    return target // g, source // g
