"""The board side of the external memory: the sequencer that initializes a LiteDRAM core over
its Wishbone control bus (the core has no CPU to run LiteDRAM's BIOS), and the bridge from the
accelerator's burst read port (``hdl/extmem.py``) and the host's word writes to the core's
native user port (LiteDRAM ``LiteDRAMNativePort``: ``cmd`` valid/ready/we/addr, ``wdata``
valid/ready/data/we, ``rdata`` valid/ready/data; read data returns in command order)."""

from amaranth.hdl import ClockSignal, Instance, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..hdl.extmem import connect_read_port

__all__ = ["DramInit", "NativeBridge", "attach_litedram"]


class DramInit(wiring.Component):
    """Performs ``writes`` (``(word address, data, cycles to wait after it)``, from
    :func:`hwonnx.boards.litedram.init_writes`) on a Wishbone bus in order after reset, each a
    classic single write held until ``ack``; the next begins ``wait + 2`` cycles after that
    ``ack``. Then raises ``done``.

    Members
    -------
    cyc, stb, we, adr, dat_w, sel, ack : the Wishbone master (32-bit data, word addresses).
    done : ``Out(1)`` the last write and its wait are over.
    """

    def __init__(self, writes: "list[tuple[int, int, int]]"):
        if not writes:
            raise ValueError("DramInit needs at least one write")
        self._writes = list(writes)
        super().__init__({
            "cyc": Out(1), "stb": Out(1), "we": Out(1), "adr": Out(30), "dat_w": Out(32),
            "sel": Out(4), "ack": In(1), "done": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        writes = self._writes
        longest = max(delay for _, _, delay in writes)
        rom = Memory(shape=30 + 32 + 32, depth=len(writes), init=[
            adr | (data << 30) | (delay << 62) for adr, data, delay in writes])
        m.submodules.rom = rom
        read = rom.read_port(domain="comb")
        index = Signal(range(len(writes) + 1))
        wait = Signal(range(longest + 1))
        m.d.comb += [read.addr.eq(index), self.adr.eq(read.data[:30]),
                     self.dat_w.eq(read.data[30:62]), self.sel.eq(0b1111), self.we.eq(1)]
        with m.FSM():
            with m.State("WRITE"):
                m.d.comb += [self.cyc.eq(1), self.stb.eq(1)]
                with m.If(self.ack):
                    m.d.sync += wait.eq(read.data[62:])
                    m.next = "WAIT"
            with m.State("WAIT"):
                with m.If(wait != 0):
                    m.d.sync += wait.eq(wait - 1)
                with m.Elif(index == len(writes) - 1):
                    m.next = "DONE"
                with m.Else():
                    m.d.sync += index.eq(index + 1)
                    m.next = "WRITE"
            with m.State("DONE"):
                m.d.comb += self.done.eq(1)
        return m


class NativeBridge(wiring.Component):
    """The accelerator's burst reads (``cmd_*``, ``rvalid``, ``rdata``: ``hdl/extmem.py``) and
    the host's single-word writes (``wr_valid`` held until ``wr_ready``) on a LiteDRAM native
    port of words as wide as the accelerator's (``port_*``). A read of ``cmd_len`` words is
    taken when no other is being issued and becomes ``cmd_len`` port commands; the port
    returns their data in order, passed on as it comes. A write waits until no read command
    is left to issue. The port's address is ``addr_bits`` wide: the memory's size in words.

    Members
    -------
    cmd_valid, cmd_ready, cmd_addr, cmd_len, rvalid, rdata : the accelerator's read port.
    wr_valid, wr_ready, wr_addr, wr_data : the host's writes.
    port_cmd_valid, port_cmd_ready, port_cmd_we, port_cmd_addr, port_wdata_valid,
    port_wdata_ready, port_wdata_data, port_wdata_we, port_rdata_valid, port_rdata_ready,
    port_rdata_data : the native port.
    """

    def __init__(self, width: int, addr_bits: int, burst: int):
        super().__init__({
            "cmd_valid": In(1), "cmd_ready": Out(1), "cmd_addr": In(32),
            "cmd_len": In(range(burst + 1)), "rvalid": Out(1), "rdata": Out(width),
            "wr_valid": In(1), "wr_ready": Out(1), "wr_addr": In(32), "wr_data": In(width),
            "port_cmd_valid": Out(1), "port_cmd_ready": In(1), "port_cmd_we": Out(1),
            "port_cmd_addr": Out(addr_bits),
            "port_wdata_valid": Out(1), "port_wdata_ready": In(1), "port_wdata_data": Out(width),
            "port_wdata_we": Out(width // 8),
            "port_rdata_valid": In(1), "port_rdata_ready": Out(1), "port_rdata_data": In(width),
        })
        self._burst = burst

    def elaborate(self, platform):
        m = Module()
        left = Signal(range(self._burst + 1))         # read commands still to issue
        addr = Signal(32)
        m.d.comb += [self.port_rdata_ready.eq(1), self.rvalid.eq(self.port_rdata_valid),
                     self.rdata.eq(self.port_rdata_data),
                     self.port_wdata_data.eq(self.wr_data), self.port_wdata_we.eq(~0)]
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.cmd_ready.eq(1)
                with m.If(self.cmd_valid & (self.cmd_len != 0)):
                    m.d.sync += [left.eq(self.cmd_len), addr.eq(self.cmd_addr)]
                    m.next = "READ"
                with m.Elif(self.wr_valid):
                    m.next = "WRITE_CMD"
            with m.State("READ"):
                m.d.comb += [self.port_cmd_valid.eq(1), self.port_cmd_addr.eq(addr)]
                with m.If(self.port_cmd_ready):
                    m.d.sync += [left.eq(left - 1), addr.eq(addr + 1)]
                    with m.If(left == 1):
                        m.next = "IDLE"
            with m.State("WRITE_CMD"):
                m.d.comb += [self.port_cmd_valid.eq(1), self.port_cmd_we.eq(1),
                             self.port_cmd_addr.eq(self.wr_addr)]
                with m.If(self.port_cmd_ready):
                    m.next = "WRITE_DATA"
            with m.State("WRITE_DATA"):
                m.d.comb += self.port_wdata_valid.eq(1)
                with m.If(self.port_wdata_ready):
                    m.d.comb += self.wr_ready.eq(1)
                    m.next = "IDLE"
        return m


def attach_litedram(m: Module, platform, system, core, burst: int) -> None:
    """Add to ``m`` the LiteDRAM ``core`` (:class:`hwonnx.boards.litedram.DramCore`, its
    Verilog added to ``platform``'s build) on the board's ``sdram`` pins, initialized by a
    :class:`DramInit` and joined to ``system``'s (:class:`~hwonnx.boards.top.SystemTop`)
    external-memory ports through a :class:`NativeBridge`.

    The core drives its pins through its own I/O registers (and the data pins through its own
    TRELLIS_IO), so they connect to the pads directly, at the core's polarity (active-low
    command pins). The memory's clock is the system clock inverted (an ODDRX1F that outputs 0
    in the clock's high half, 1 in its low half): the SDRAM samples in the middle of each
    command and data cycle."""
    from .litedram import init_writes

    platform.add_file(core.verilog.name, core.verilog.read_text())
    pins = platform.request("sdram", 0, dir="-")
    width = core.port_data_bits
    m.submodules.dram_init = init = DramInit(init_writes(core))
    m.submodules.dram_bridge = bridge = NativeBridge(width, core.port_addr_bits, burst)
    connect_read_port(m, system, bridge, requester_prefix="ext_")
    m.d.comb += [bridge.wr_valid.eq(system.ext_wr_valid), system.ext_wr_ready.eq(bridge.wr_ready),
                 bridge.wr_addr.eq(system.ext_wr_addr), bridge.wr_data.eq(system.ext_wr_data)]
    m.submodules.sdram_clock = Instance("ODDRX1F", i_SCLK=ClockSignal(), i_RST=0, i_D0=0,
                                        i_D1=1, o_Q=pins.clk.io)
    m.submodules.dram = Instance(
        core.module, i_clk=ClockSignal(), i_rst=0,    # holds its state through a reset
        o_sdram_a=pins.a.io, o_sdram_ba=pins.ba.io, o_sdram_cas_n=pins.cas.io,
        o_sdram_cke=pins.clk_en.io, o_sdram_cs_n=pins.cs.io, o_sdram_dm=pins.dqm.io,
        io_sdram_dq=pins.dq.io, o_sdram_ras_n=pins.ras.io, o_sdram_we_n=pins.we.io,
        i_wb_ctrl_adr=init.adr, i_wb_ctrl_dat_w=init.dat_w, i_wb_ctrl_sel=init.sel,
        i_wb_ctrl_cyc=init.cyc, i_wb_ctrl_stb=init.stb, i_wb_ctrl_we=init.we,
        i_wb_ctrl_cti=0, i_wb_ctrl_bte=0, o_wb_ctrl_ack=init.ack,
        i_user_port_dma_cmd_valid=bridge.port_cmd_valid,
        o_user_port_dma_cmd_ready=bridge.port_cmd_ready,
        i_user_port_dma_cmd_we=bridge.port_cmd_we, i_user_port_dma_cmd_addr=bridge.port_cmd_addr,
        i_user_port_dma_wdata_valid=bridge.port_wdata_valid,
        o_user_port_dma_wdata_ready=bridge.port_wdata_ready,
        i_user_port_dma_wdata_data=bridge.port_wdata_data,
        i_user_port_dma_wdata_we=bridge.port_wdata_we,
        o_user_port_dma_rdata_valid=bridge.port_rdata_valid,
        i_user_port_dma_rdata_ready=bridge.port_rdata_ready,
        o_user_port_dma_rdata_data=bridge.port_rdata_data)
