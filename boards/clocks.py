"""Clock generation for boards whose oscillator is faster than the accelerator's clock."""

from amaranth.hdl import ClockDomain, ClockSignal, Instance, Module, Signal
from amaranth.lib import io
from amaranth.lib.cdc import ResetSynchronizer

__all__ = ["pll_domain", "ecp5_pll", "pll_clock", "PLL_FAMILIES"]

#: The ECP5 EHXPLLL's limits (ECP5 and ECP5-5G Family Data Sheet, sysCLOCK PLL timing: the
#: phase detector's input, the VCO, the output; the dividers' ranges of the primitive).
ECP5_PFD_HZ = (3_125_000, 400_000_000)
ECP5_VCO_HZ = (400_000_000, 800_000_000)
ECP5_OUT_HZ = (3_125_000, 400_000_000)
ECP5_DIVIDERS = {"CLKI_DIV": 128, "CLKFB_DIV": 80, "CLKOP_DIV": 128}

#: The families whose PLL this module sets to any clock (``--clock``); the others keep the
#: clock of their board description.
PLL_FAMILIES = ("ecp5",)


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
        clki_div, fb_div, op_div, made = ecp5_pll(source_hz, clock_hz)
        if made != clock_hz:
            raise ValueError(f"The ECP5 PLL makes {made} Hz, not {clock_hz} Hz, from "
                             f"{source_hz} Hz: use pll_clock() for the board's clock")
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


def ecp5_pll(source_hz: int, target_hz: int) -> "tuple[int, int, int, int]":
    """``(CLKI_DIV, CLKFB_DIV, CLKOP_DIV, output Hz)``: the fastest whole-hertz clock of at
    most ``target_hz`` the EHXPLLL makes from ``source_hz`` within its limits (output =
    source / CLKI_DIV * CLKFB_DIV with the feedback from CLKOP; VCO = output * CLKOP_DIV), the
    smallest dividers first; None when there is none."""
    best = None
    for clki in range(1, ECP5_DIVIDERS["CLKI_DIV"] + 1):
        if not ECP5_PFD_HZ[0] <= source_hz / clki <= ECP5_PFD_HZ[1]:
            continue
        for fb in range(1, ECP5_DIVIDERS["CLKFB_DIV"] + 1):
            if source_hz * fb % clki:
                continue
            out = source_hz * fb // clki
            if out > min(target_hz, ECP5_OUT_HZ[1]):
                break
            op = -(-ECP5_VCO_HZ[0] // out)
            if ECP5_OUT_HZ[0] <= out and op <= ECP5_DIVIDERS["CLKOP_DIV"] \
                    and out * op <= ECP5_VCO_HZ[1] and (best is None or out > best[3]):
                best = (clki, fb, op, out)
    return best


def pll_clock(family: str, source_hz: int, target_hz: int) -> int:
    """The clock the ``family``'s PLL makes for ``target_hz`` from ``source_hz``: the fastest
    of at most ``target_hz`` (from a 25 MHz oscillator the ECP5's are 3.125 MHz apart at
    most). Raises ``ValueError`` with the reason: a family without a recipe here, or a
    target below what the PLL makes."""
    if family not in PLL_FAMILIES:
        raise ValueError(f"hwonnx sets the PLL of {', '.join(PLL_FAMILIES)} boards only, not "
                         f"of {family} ones")
    found = ecp5_pll(source_hz, target_hz)
    if found is None:
        raise ValueError(f"the ECP5 PLL makes {ECP5_OUT_HZ[0] / 1e6:g} to "
                         f"{ECP5_OUT_HZ[1] / 1e6:g} MHz, not {target_hz / 1e6:g} MHz")
    return found[3]
