"""The board side of the external memory: the LiteDRAM core, brought up by its sequencer
(``boards/dram_init.py``), and the bridge from the accelerator's burst read port
(``hdl/extmem.py``) and the host's word writes to the core's native user port (LiteDRAM
``LiteDRAMNativePort``: ``cmd`` valid/ready/we/addr, ``wdata`` valid/ready/data/we, ``rdata``
valid/ready/data; read data returns in command order), across clock domains where the core
has its own clock (DDR3)."""

from amaranth.hdl import (ClockDomain, ClockSignal, DomainRenamer, Instance, Module,
                          ResetSignal, Signal)
from amaranth.lib import wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from ..hdl.extmem import ext_port

__all__ = ["NativeBridge", "NativePortCDC", "attach_litedram", "PINS", "XDC", "native_port"]


def native_port(width: int, addr_bits: int) -> wiring.Signature:
    """A LiteDRAM native port of ``width``-bit words as its user (the master) drives it."""
    return wiring.Signature({
        "cmd_valid": Out(1), "cmd_ready": In(1), "cmd_we": Out(1), "cmd_addr": Out(addr_bits),
        "wdata_valid": Out(1), "wdata_ready": In(1), "wdata_data": Out(width),
        "wdata_we": Out(width // 8),
        "rdata_valid": In(1), "rdata_ready": Out(1), "rdata_data": In(width)})


class NativeBridge(wiring.Component):
    """The accelerator's burst reads and the host's single-word writes (``ext``:
    ``hdl/extmem.ext_port``) on a LiteDRAM native port (``port``) of words as wide as the
    accelerator's or wider (``port_width``: a power of two; a word written is zero-extended,
    a word read truncated). A read of ``cmd_len`` words is taken when no other is being
    issued and becomes ``cmd_len`` port commands; the port returns their data in order, passed
    on as it comes. A write waits until no read command is left to issue. The port's address
    is ``addr_bits`` wide: the memory's size in words.

    Members
    -------
    ext : ``In(ext_port(width, burst))``: the reads and writes.
    port : ``Out(native_port(port_width, addr_bits))``: the native port.
    """

    def __init__(self, width: int, addr_bits: int, burst: int, port_width: "int | None" = None):
        port_width = port_width or width
        super().__init__({
            "ext": In(ext_port(width, burst)),
            "port": Out(native_port(port_width, addr_bits)),
        })
        self._burst = burst

    def elaborate(self, platform):
        m = Module()
        left = Signal(range(self._burst + 1))         # read commands still to issue
        addr = Signal(32)
        m.d.comb += [self.port.rdata_ready.eq(1), self.ext.rvalid.eq(self.port.rdata_valid),
                     self.ext.rdata.eq(self.port.rdata_data),
                     self.port.wdata_data.eq(self.ext.wr_data), self.port.wdata_we.eq(~0)]
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.ext.cmd_ready.eq(1)
                with m.If(self.ext.cmd_valid & (self.ext.cmd_len != 0)):
                    m.d.sync += [left.eq(self.ext.cmd_len), addr.eq(self.ext.cmd_addr)]
                    m.next = "READ"
                with m.Elif(self.ext.wr_valid):
                    m.next = "WRITE_CMD"
            with m.State("READ"):
                m.d.comb += [self.port.cmd_valid.eq(1), self.port.cmd_addr.eq(addr)]
                with m.If(self.port.cmd_ready):
                    m.d.sync += [left.eq(left - 1), addr.eq(addr + 1)]
                    with m.If(left == 1):
                        m.next = "IDLE"
            with m.State("WRITE_CMD"):
                m.d.comb += [self.port.cmd_valid.eq(1), self.port.cmd_we.eq(1),
                             self.port.cmd_addr.eq(self.ext.wr_addr)]
                with m.If(self.port.cmd_ready):
                    m.next = "WRITE_DATA"
            with m.State("WRITE_DATA"):
                m.d.comb += self.port.wdata_valid.eq(1)
                with m.If(self.port.wdata_ready):
                    m.d.comb += self.ext.wr_ready.eq(1)
                    m.next = "IDLE"
        return m


#: Each memory's pins: the amaranth-boards resource, and the core's pin -> its subsignal (a
#: differential pair's ``.p`` or ``.n``). The core drives them at its own polarity, so the
#: raw pads are used (the resources' active-low pins included).
_DDR3 = {"ddram_a": "a", "ddram_ba": "ba", "ddram_cas_n": "cas", "ddram_cke": "clk_en",
         "ddram_clk_p": "clk.p", "ddram_dm": "dm", "ddram_dq": "dq", "ddram_dqs_p": "dqs.p",
         "ddram_odt": "odt", "ddram_ras_n": "ras", "ddram_we_n": "we"}
PINS = {
    "ulx3s-sdram": ("sdram", {
        "sdram_a": "a", "sdram_ba": "ba", "sdram_cas_n": "cas", "sdram_cke": "clk_en",
        "sdram_cs_n": "cs", "sdram_dm": "dqm", "sdram_dq": "dq", "sdram_ras_n": "ras",
        "sdram_we_n": "we"}),
    # The ECP5's differential outputs and inputs take their P pad only.
    "ecpix5-ddr3": ("ddr3", _DDR3),
    # The Xilinx PHY drives both pads of its pairs (OBUFDS, IOBUFDS), chip select and reset.
    "arty-ddr3": ("ddr3", {**_DDR3, "ddram_clk_n": "clk.n", "ddram_dqs_n": "dqs.n",
                           "ddram_cs_n": "cs", "ddram_reset_n": "rst"}),
}

#: Vivado constraints a memory's pins need beyond the resource's: the Arty's DDR3 bank (34)
#: takes its SSTL135 reference from the FPGA (as LiteX's Arty platform sets it).
XDC = {"arty-ddr3": "set_property INTERNAL_VREF 0.675 [get_iobanks 34]\n"}

class NativePortCDC(wiring.Component):
    """A native port in the ``dram`` domain (``down``, the controller's) offered in ``sync``
    (``up``, :class:`NativeBridge`'s ``port``) through three asynchronous FIFOs: commands
    and write data down, read data up. A read command is taken only while fewer than
    ``depth`` read words are in flight or unclaimed, so the read-data FIFO never overflows
    and the controller's ``rdata_ready`` stays high.

    Members
    -------
    up : ``In(native_port(width, addr_bits))``, in ``sync``.
    down : ``Out(native_port(width, addr_bits))``, in ``dram``.
    """

    def __init__(self, width: int, addr_bits: int, depth: int = 32):
        super().__init__({"up": In(native_port(width, addr_bits)),
                          "down": Out(native_port(width, addr_bits))})
        self._width, self._addr_bits, self._depth = width, addr_bits, depth

    def elaborate(self, platform):
        from amaranth.hdl import Cat
        from amaranth.lib.fifo import AsyncFIFO
        m = Module()
        w, a, depth = self._width, self._addr_bits, self._depth
        m.submodules.cmd = cmd = AsyncFIFO(width=a + 1, depth=4, w_domain="sync",
                                           r_domain="dram")
        m.submodules.wdata = wdata = AsyncFIFO(width=w + w // 8, depth=4, w_domain="sync",
                                               r_domain="dram")
        m.submodules.rdata = rdata = AsyncFIFO(width=w, depth=depth, w_domain="dram",
                                               r_domain="sync")
        in_flight = Signal(range(depth + 1))
        accept = cmd.w_rdy & (self.up.cmd_we | (in_flight < depth))
        issued = self.up.cmd_valid & accept & ~self.up.cmd_we
        taken = rdata.r_rdy & self.up.rdata_ready
        m.d.sync += in_flight.eq(in_flight + issued - taken)
        m.d.comb += [
            self.up.cmd_ready.eq(accept), cmd.w_en.eq(self.up.cmd_valid & accept),
            cmd.w_data.eq(Cat(self.up.cmd_addr, self.up.cmd_we)),
            self.down.cmd_valid.eq(cmd.r_rdy), cmd.r_en.eq(self.down.cmd_ready),
            self.down.cmd_addr.eq(cmd.r_data[:a]), self.down.cmd_we.eq(cmd.r_data[a]),
            self.up.wdata_ready.eq(wdata.w_rdy), wdata.w_en.eq(self.up.wdata_valid),
            wdata.w_data.eq(Cat(self.up.wdata_data, self.up.wdata_we)),
            self.down.wdata_valid.eq(wdata.r_rdy), wdata.r_en.eq(self.down.wdata_ready),
            self.down.wdata_data.eq(wdata.r_data[:w]), self.down.wdata_we.eq(wdata.r_data[w:]),
            rdata.w_en.eq(self.down.rdata_valid), rdata.w_data.eq(self.down.rdata_data),
            self.down.rdata_ready.eq(1),
            self.up.rdata_valid.eq(rdata.r_rdy), self.up.rdata_data.eq(rdata.r_data),
            rdata.r_en.eq(self.up.rdata_ready)]
        return m


def attach_litedram(m: Module, platform, system, core, burst: int, oscillator=None) -> None:
    """Add to ``m`` the LiteDRAM ``core`` (:class:`hwonnx.boards.litedram.DramCore`, its
    Verilog added to ``platform``'s build) on the board's memory pins, brought up by a
    :class:`~hwonnx.boards.dram_init.DramInit` and joined to ``system``'s
    (:class:`~hwonnx.boards.top.SystemTop`) external-memory ports through a
    :class:`NativeBridge`.

    The core drives its pins through its own I/O registers and buffers, so they connect to
    the pads directly, at the core's polarity (active-low command pins).

    - SDR (``ulx3s-sdram``): the core runs on the accelerator's clock; the memory's clock is
      that clock inverted (an ODDRX1F that outputs 0 in the clock's high half, 1 in its low
      half): the SDRAM samples in the middle of each command and data cycle.
    - DDR3 (``ecpix5-ddr3``, ``arty-ddr3``): the core makes its clocks from ``oscillator``
      (the board's oscillator) and runs in the ``dram`` domain, its sequencer too; the bridge
      reaches it through a :class:`NativePortCDC`.

    The sequencer's ``done`` and ``error`` reach ``system``'s ``ext_ready`` and
    ``ext_failed`` (STATUS) through synchronizers."""
    from .dram_init import DramInit
    from .litedram import handover_writes, init_writes, read_leveling

    platform.add_file(core.verilog.name, core.verilog.read_text())
    width = core.port_data_bits
    m.submodules.dram_bridge = bridge = NativeBridge(len(system.ext.rdata), core.port_addr_bits,
                                                     burst, width)
    wiring.connect(m, system.ext, bridge.ext)
    if core.own_clock:
        init = DramInit(init_writes(core, handover=False), read_leveling(core),
                        handover_writes(core), handover_writes(core, error=True))
        m.submodules.dram_init = DomainRenamer({"sync": "dram"})(init)
        m.submodules.dram_cdc = cdc = NativePortCDC(width, core.port_addr_bits)
        wiring.connect(m, bridge.port, cdc.up)
        port = cdc.down
        m.domains.dram = ClockDomain("dram")
        user_clk, user_rst = Signal(), Signal()
        m.d.comb += [ClockSignal("dram").eq(user_clk), ResetSignal("dram").eq(user_rst)]
        memory = dict(i_clk=oscillator, i_rst=0, o_user_clk=user_clk, o_user_rst=user_rst)
    else:
        m.submodules.dram_init = init = DramInit(init_writes(core))
        port = bridge.port
        memory = dict(i_clk=ClockSignal(), i_rst=0)     # holds its state through a reset
    resource, connections = PINS[core.memory]
    pins = platform.request(resource, 0, dir="-")
    for name, path in connections.items():
        pin = pins
        for part in path.split("."):
            pin = getattr(pin, part)
        inout = name.endswith(("_dq", "_dqs_p", "_dqs_n"))
        memory[f"{'io' if inout else 'o'}_{name}"] = getattr(pin, "io", pin)
    if core.memory == "ulx3s-sdram":
        m.submodules.sdram_clock = Instance("ODDRX1F", i_SCLK=ClockSignal(), i_RST=0, i_D0=0,
                                            i_D1=1, o_Q=pins.clk.io)
    # STATUS tells the host whether the memory came up (the sequencer's flags, in the
    # accelerator's clock).
    done, error = Signal(), Signal()
    m.submodules.dram_done = FFSynchronizer(init.done, done)
    m.submodules.dram_error = FFSynchronizer(init.error, error)
    m.d.comb += [system.ext_ready.eq(done & ~error), system.ext_failed.eq(error)]
    if core.memory in XDC:
        platform.add_file(f"{core.module}.xdc", XDC[core.memory])
    user = {f"{'i' if member.flow == Out else 'o'}_user_port_dma_{name}": getattr(port, name)
            for name, member in port.signature.members.items()}
    m.submodules.dram = Instance(
        core.module, **memory, **user,
        i_wb_ctrl_adr=init.adr, i_wb_ctrl_dat_w=init.dat_w, i_wb_ctrl_sel=init.sel,
        i_wb_ctrl_cyc=init.cyc, i_wb_ctrl_stb=init.stb, i_wb_ctrl_we=init.we,
        i_wb_ctrl_cti=0, i_wb_ctrl_bte=0, o_wb_ctrl_ack=init.ack, o_wb_ctrl_dat_r=init.dat_r)
