"""The system top: the accelerator with its program baked in, the UART host bridge, and the
board's clock and pins."""

from amaranth.hdl import Elaboratable, Module, Mux
from amaranth.lib import io, wiring
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from ..errors import UsageError
from .bridge import HostBridge
from ..hdl.extmem import ext_port
from ..hdl.top import Accelerator
from .clocks import pll_domain
from .registry import Board

__all__ = ["SystemTop", "BoardTop", "DEFAULT_BAUD", "uart_divisor"]

DEFAULT_BAUD = 115_200


def uart_divisor(clock_hz: int, baud: int) -> int:
    """The UART's clock cycles per bit for ``baud`` at ``clock_hz``: a whole number of at
    least 4 (``boards/uart.py``) whose rate is within 2% of ``baud`` (a UART receiver samples
    each bit in its middle, so the two ends may differ by a few percent over a character)."""
    divisor = round(clock_hz / baud) if baud > 0 else 0
    if divisor < 4 or abs(clock_hz / divisor - baud) > 0.02 * baud:
        near = sorted({round(clock_hz / d) for d in (max(divisor, 4), max(divisor, 4) + 1)})
        raise UsageError(f"A UART of {baud} baud cannot run from the {clock_hz / 1e6:g} MHz "
                         f"clock: it divides the clock by a whole number of at least 4, "
                         f"within 2% (near it: {' or '.join(map(str, near))} baud)")
    return divisor

class SystemTop(wiring.Component):
    """Accelerator (program, weights and parameters as block-RAM initial contents) plus the
    UART host bridge. Platform independent: the full-system simulation runs exactly this.

    Members
    -------
    rx : ``In(1)`` UART receive pin. tx : ``Out(1)`` UART transmit pin.
    ext : ``Out(ext_port(cols * 8, burst))``: the external memory, for the accelerator's DMA
    engine and the host bridge (READX, WRITEX); ext_ready and ext_failed : ``In(1)`` the
    memory is up or failed to come up (STATUS); ext_restart : ``Out(1)`` the accelerator's
    ``start`` (a memory model's refresh schedule starts over). With ``ArchConfig.ext_memory``
    only, for the memory or its model outside.
    """

    def __init__(self, config: ArchConfig, images: "dict[str, list[int]]", divisor: int,
                 build_id: int, logic_products: int = 0):
        self._config = config
        self._accel = Accelerator(config, images, logic_products)
        self._bridge = HostBridge(config, divisor, build_id)
        members = {"rx": In(1, init=1), "tx": Out(1, init=1)}
        if config.ext_memory:
            members.update(ext=Out(ext_port(config.cols * 8, config.ext_timing.burst)),
                           ext_ready=In(1), ext_failed=In(1))
            members["ext_restart"] = Out(1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.accel = accel = self._accel
        m.submodules.bridge = bridge = self._bridge
        wiring.connect(m, bridge.accel, accel.host)
        m.d.comb += [bridge.rx.eq(self.rx), self.tx.eq(bridge.tx)]
        if self._config.ext_memory:
            # One read port: the accelerator's (its DMA engine, while it runs) or the host's
            # (READX, while it does not); a word read for the host is the host's alone.
            ours, dma, link = self.ext, accel.ext, bridge.ext
            host = link.cmd_valid
            m.d.comb += [
                ours.cmd_valid.eq(dma.cmd_valid | host),
                ours.cmd_addr.eq(Mux(host, link.cmd_addr, dma.cmd_addr)),
                ours.cmd_len.eq(Mux(host, link.cmd_len, dma.cmd_len)),
                dma.cmd_ready.eq(ours.cmd_ready & ~host), link.cmd_ready.eq(ours.cmd_ready),
                dma.rvalid.eq(ours.rvalid & ~bridge.ext_reading), link.rvalid.eq(ours.rvalid),
                dma.rdata.eq(ours.rdata), link.rdata.eq(ours.rdata)]
            # One write port: the accelerator's (STOREA, while it runs) or else the host's
            # (WRITEX, while it does not).
            storing = dma.wr_valid
            m.d.comb += [
                ours.wr_valid.eq(storing | link.wr_valid),
                ours.wr_addr.eq(Mux(storing, dma.wr_addr, link.wr_addr)),
                ours.wr_data.eq(Mux(storing, dma.wr_data, link.wr_data)),
                dma.wr_ready.eq(ours.wr_ready), link.wr_ready.eq(ours.wr_ready & ~storing),
                self.ext_restart.eq(accel.host.start),
                bridge.ext_ready.eq(self.ext_ready), bridge.ext_failed.eq(self.ext_failed)]
        return m


class BoardTop(Elaboratable):
    """:class:`SystemTop` on a board: clock (through a PLL where the board needs one), reset
    and the UART pins from the amaranth-boards platform; with an external memory, its
    controller ``dram`` (:func:`hwonnx.boards.litedram.generate_controller`) on the board's
    memory pins (:func:`hwonnx.boards.dram.attach_litedram`)."""

    def __init__(self, board: Board, config: ArchConfig, images: "dict[str, list[int]]",
                 build_id: int, baud: int = DEFAULT_BAUD, dram=None, logic_products: int = 0):
        if bool(config.ext_memory) != (dram is not None):
            raise ValueError("BoardTop needs the external memory's controller (dram) exactly "
                             "when the architecture has an external memory")
        self.board, self.config, self.images = board, config, images
        self.build_id, self.baud, self.dram = build_id, baud, dram
        self.logic_products = logic_products        # boards/fit.py: beyond the DSP blocks

    @property
    def divisor(self) -> int:
        return uart_divisor(self.board.clock_hz, self.baud)

    def elaborate(self, platform):
        m = Module()
        oscillator = None
        if self.board.pll:
            oscillator = pll_domain(m, platform, self.board.family, self.board.clock_hz)
        m.submodules.system = system = SystemTop(self.config, self.images, self.divisor,
                                                 self.build_id, self.logic_products)
        uart = platform.request("uart", 0, dir="-")
        m.submodules.rx_buf = rx_buf = io.Buffer("i", uart.rx)
        m.submodules.tx_buf = tx_buf = io.Buffer("o", uart.tx)
        m.d.comb += [system.rx.eq(rx_buf.i), tx_buf.o.eq(system.tx)]
        if self.dram is not None:
            from .dram import attach_litedram
            attach_litedram(m, platform, system, self.dram, self.config.ext_timing.burst,
                            oscillator)
        if "uart_tx_enable" in {r.name for r in platform.resources.values()}:
            enable = platform.request("uart_tx_enable", 0, dir="-")
            m.submodules.tx_enable = tx_enable = io.Buffer("o", enable)
            m.d.comb += tx_enable.o.eq(1)
        return m
