"""A minimal 8N1 UART: one start bit, eight data bits (least significant first), one stop bit,
no parity. Amaranth 0.5 has no UART core, so the host link brings its own."""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

__all__ = ["UartTx", "UartRx", "CheckedComponent", "check_divisor"]


class CheckedComponent(wiring.Component):
    """A component whose arguments are checked before it exists: ``check`` (a staticmethod
    taking the constructor's arguments) raises on bad ones, so a rejected component is never
    created and leaves no "created but never used" warning behind."""

    @staticmethod
    def check(*args, **kwargs) -> None:
        """Raise on bad arguments (each subclass has its own; none by default)."""

    def __new__(cls, *args, **kwargs):
        cls.check(*args, **kwargs)
        return super().__new__(cls, src_loc_at=1)


def check_divisor(divisor) -> None:
    if not isinstance(divisor, int) or isinstance(divisor, bool) or divisor < 4:
        raise ValueError(f"UART divisor must be an integer of at least 4 clock cycles per bit, "
                         f"not {divisor!r}")


class _Uart(CheckedComponent):
    """A side of the UART: ``divisor`` clock cycles per bit, checked before it exists."""

    @staticmethod
    def check(divisor, *args) -> None:
        check_divisor(divisor)

    def __init__(self, divisor: int, members: dict):
        self._divisor = divisor
        super().__init__(members)


class UartTx(_Uart):
    """8N1 transmitter: sends each byte accepted on ``data`` on the ``tx`` pin.

    Every bit lasts exactly ``divisor`` clock cycles. ``data.ready`` is high while the
    transmitter is idle and in the last cycle of a stop bit, so bytes offered back to back go
    out with no idle time between the stop bit and the next start bit. ``tx`` is a register
    and idles high.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit (``clock_hz // baudrate``), at least 4.

    Members
    -------
    data : ``In(stream.Signature(8))``
        Bytes to send; obeys the Amaranth stream rules (``ready`` does not depend on
        ``valid``).
    tx : ``Out(1, init=1)``
        Serial output pin.

    Raises
    ------
    ValueError
        If ``divisor`` is not an integer of at least 4.
    """

    def __init__(self, divisor: int):
        super().__init__(divisor, {"data": In(stream.Signature(8)), "tx": Out(1, init=1)})

    @property
    def divisor(self) -> int:
        return self._divisor

    def elaborate(self, platform):
        m = Module()
        busy = Signal()
        shreg = Signal(9)                       # data bits then the stop bit, LSB first
        remaining = Signal(range(10))           # bits still to shift out after the current one
        count = Signal(range(self.divisor))     # cycles left in the current bit
        last = Signal()                         # last cycle of the stop bit
        m.d.comb += [last.eq(busy & (count == 0) & (remaining == 0)),
                     self.data.ready.eq(~busy | last)]

        with m.If(self.data.valid & self.data.ready):
            m.d.sync += [busy.eq(1), self.tx.eq(0), shreg.eq(Cat(self.data.payload, 1)),
                         remaining.eq(9), count.eq(self.divisor - 1)]
        with m.Elif(last):
            m.d.sync += busy.eq(0)
        with m.Elif(busy):
            with m.If(count == 0):
                m.d.sync += [self.tx.eq(shreg[0]), shreg.eq(shreg >> 1),
                             remaining.eq(remaining - 1), count.eq(self.divisor - 1)]
            with m.Else():
                m.d.sync += count.eq(count - 1)
        return m


class UartRx(_Uart):
    """8N1 receiver: reassembles bytes from the ``rx`` pin and offers them on ``data``.

    ``rx`` passes through a two-flop synchronizer. A falling edge starts a byte; the start bit
    is sampled again half a bit later and, if the line is high by then, the edge was a glitch
    and is ignored. Data bits and the stop bit are sampled in the middle of each bit, every
    ``divisor`` cycles. A byte whose stop bit reads 0 is dropped and ``error`` pulses for one
    cycle; the receiver then waits for the line to go high before it looks for the next start
    bit (so a held-low line, a *break*, yields one error, not a stream of zero bytes).

    The receiver holds one byte. A byte that completes while the previous one is still
    waiting on ``data`` (not accepted within about one byte time) is dropped and ``overrun``
    pulses for one cycle; the waiting byte is kept.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit (``clock_hz // baudrate``), at least 4.

    Members
    -------
    rx : ``In(1, init=1)``
        Serial input pin (asynchronous to the clock).
    data : ``Out(stream.Signature(8))``
        Received bytes; obeys the Amaranth stream rules.
    error : ``Out(1)``
        One-cycle pulse: a framing error (stop bit 0) dropped a byte.
    overrun : ``Out(1)``
        One-cycle pulse: a byte was dropped because ``data`` was still full.

    Raises
    ------
    ValueError
        If ``divisor`` is not an integer of at least 4.
    """

    def __init__(self, divisor: int):
        super().__init__(divisor, {"rx": In(1, init=1), "data": Out(stream.Signature(8)),
                                   "error": Out(1), "overrun": Out(1)})

    @property
    def divisor(self) -> int:
        return self._divisor

    def elaborate(self, platform):
        m = Module()
        line = Signal(init=1)
        m.submodules.sync = FFSynchronizer(self.rx, line, init=1, stages=2)

        count = Signal(range(self.divisor))
        bit = Signal(range(8))
        shreg = Signal(8)
        m.d.sync += [self.error.eq(0), self.overrun.eq(0)]
        with m.If(self.data.ready):
            m.d.sync += self.data.valid.eq(0)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(~line):
                    m.d.sync += count.eq(self.divisor // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                with m.If(count != 0):
                    m.d.sync += count.eq(count - 1)
                with m.Elif(line):
                    m.next = "IDLE"             # high again at mid-bit: a glitch, not a start
                with m.Else():
                    m.d.sync += [count.eq(self.divisor - 1), bit.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                with m.If(count != 0):
                    m.d.sync += count.eq(count - 1)
                with m.Else():
                    m.d.sync += [shreg.eq(Cat(shreg[1:], line)), bit.eq(bit + 1),
                                 count.eq(self.divisor - 1)]
                    with m.If(bit == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(count != 0):
                    m.d.sync += count.eq(count - 1)
                with m.Elif(~line):
                    m.d.sync += self.error.eq(1)
                    m.next = "BREAK"
                with m.Else():
                    with m.If(~self.data.valid | self.data.ready):
                        m.d.sync += [self.data.payload.eq(shreg), self.data.valid.eq(1)]
                    with m.Else():
                        m.d.sync += self.overrun.eq(1)
                    m.next = "IDLE"
            with m.State("BREAK"):
                with m.If(line):
                    m.next = "IDLE"
        return m
