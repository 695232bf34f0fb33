"""Board platforms hwonnx completes: amaranth-boards classes with the UART host link they lack,
and the Gowin open flow with the nextpnr that YoWASP ships.

Every board hwonnx builds for talks to the host over a UART (``uart`` resource 0). Where the
amaranth-boards platform defines none, the subclasses here add one on the board's own header,
in amaranth-boards' resource style, for a 3.3 V USB-serial adapter (or a Pmod USBUART)."""

from amaranth.build import Attrs
from amaranth_boards.arty_z7 import ArtyZ720Platform
from amaranth_boards.extensions.pmod import PmodUARTType4Resource
from amaranth_boards.orangecrab_r0_2 import (OrangeCrabR0_2_25FPlatform,
                                             OrangeCrabR0_2_85FPlatform)
from amaranth_boards.resources import UARTResource
from amaranth_boards.upduino_v3 import UpduinoV3Platform

__all__ = ["OrangeCrab25FUARTPlatform", "OrangeCrab85FUARTPlatform", "UpduinoV3UARTPlatform",
           "ArtyZ720UARTPlatform", "himbaechel"]


class _OrangeCrabUART:
    """OrangeCrab r0.2: its only host link is the ECP5's USB pins, so the UART is on the
    Feather header, pins labelled 0 (RX, FPGA input) and 1 (TX, FPGA output), as the Feather
    convention and LiteX's OrangeCrab serial option place it. amaranth-boards appends a
    ``dfu-suffix`` step to the build script for the DFU bootloader; it is not a YoWASP tool, so
    it is left out: run ``dfu-suffix -v 1209 -p 5af0 -a hwonnx_top.bit`` before ``dfu-util``,
    or load the bitstream over JTAG."""

    resources = [
        *OrangeCrabR0_2_25FPlatform.resources,
        UARTResource(0, rx="0", tx="1", conn=("io", 0), attrs=Attrs(IO_TYPE="LVCMOS33")),
    ]

    @property
    def required_tools(self):
        return [tool for tool in super().required_tools if tool != "dfu-suffix"]

    @property
    def command_templates(self):
        return [step for step in super().command_templates if "dfu-suffix" not in step]


class OrangeCrab25FUARTPlatform(_OrangeCrabUART, OrangeCrabR0_2_25FPlatform):
    pass


class OrangeCrab85FUARTPlatform(_OrangeCrabUART, OrangeCrabR0_2_85FPlatform):
    pass


class UpduinoV3UARTPlatform(UpduinoV3Platform):
    """UPduino v3.0: the clock is the 12 MHz oscillator on pin 20 (solder the OSC jumper, as
    amaranth-boards notes), not the internal SB_HFOSC, whose ±10 % tolerance is too loose for
    a UART. The UART is on header JP6 (connector ``j`` 1), its pins 14 and 15: FPGA pins 4
    (RX, FPGA input) and 3 (TX, FPGA output)."""

    default_clk = "clk12"
    resources = [
        *UpduinoV3Platform.resources,
        UARTResource(0, rx="14", tx="15", conn=("j", 1),
                     attrs=Attrs(IO_STANDARD="SB_LVCMOS")),
    ]


class ArtyZ720UARTPlatform(ArtyZ720Platform):
    """Arty Z7-20 (the Pynq-Z1 class of Zynq-7020 boards): the USB-UART is wired to the
    processing system's MIO pins, which the programmable logic cannot reach without a PS
    configuration, so the UART is a Pmod USBUART (Pmod interface type 4) on Pmod JA."""

    resources = [
        *ArtyZ720Platform.resources,
        PmodUARTType4Resource("uart", 0, Attrs(IOSTANDARD="LVCMOS33"), pmod=0),
    ]


_HIMBAECHEL_PNR = r"""
    {{invoke_tool("nextpnr-himbaechel")}}
        {{quiet("--quiet")}}
        {{get_override("nextpnr_opts")|options}}
        --log {{name}}.tim
        --device {{platform.part}}
        --vopt family={{platform._chipdb_device}}
        --vopt cst={{name}}.cst
        --json {{name}}.syn.json
        --write {{name}}.pnr.json
    """


def himbaechel(platform_class):
    """``platform_class`` (an amaranth ``GowinPlatform``) with its Apicula flow running
    nextpnr-himbaechel, the Gowin place-and-route that YoWASP ships (``--vopt family=`` and
    ``--vopt cst=``), instead of the retired nextpnr-gowin that Amaranth 0.5's template names.
    Synthesis (``synth_gowin``) and packing (``gowin_pack`` from Apicula) are unchanged."""

    class Platform(platform_class):
        @property
        def required_tools(self):
            tools = super().required_tools
            if self.toolchain != "Apicula":
                return tools
            return ["nextpnr-himbaechel" if t == "nextpnr-gowin" else t for t in tools]

        @property
        def command_templates(self):
            templates = super().command_templates
            if self.toolchain != "Apicula":
                return templates
            return [_HIMBAECHEL_PNR if "nextpnr-gowin" in t else t for t in templates]

    Platform.__name__ = Platform.__qualname__ = platform_class.__name__
    return Platform
