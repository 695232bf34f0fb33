"""UartTx and UartRx (8N1) under the Amaranth simulator: loopback of random bytes, exact bit
timing and backpressure of the transmitter, and the receiver's false-start rejection, glitch
tolerance, framing errors and overrun."""

import re

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module
from amaranth.sim import Simulator

from hwonnx.boards.uart import UartRx, UartTx

__all__ = ["uart_levels", "UartDecoder"]


def uart_levels(byte: int, divisor: int, stop: int = 1) -> "list[int]":
    """Line level in each clock cycle of one 8N1 character."""
    bits = [0] + [byte >> i & 1 for i in range(8)] + [stop]
    return [bit for bit in bits for _ in range(divisor)]


class UartDecoder:
    """Testbench 8N1 receiver: ``feed(level)`` once per cycle returns a byte when one
    completes; a stop bit of 0 raises ``AssertionError``."""

    def __init__(self, divisor: int):
        self.divisor, self.count, self.bits = divisor, None, []

    def feed(self, level: int):
        if self.count is None:
            if level == 0:
                self.count, self.bits = self.divisor // 2, []
            return None
        self.count -= 1
        if self.count:
            return None
        self.bits.append(level)
        self.count = self.divisor
        if len(self.bits) < 10:
            return None
        self.count = None
        assert self.bits[0] == 0 and self.bits[9] == 1, f"bad character {self.bits}"
        return sum(bit << i for i, bit in enumerate(self.bits[1:9]))


class Loopback(Elaboratable):
    def __init__(self, divisor):
        self.tx, self.rx = UartTx(divisor), UartRx(divisor)

    def elaborate(self, platform):
        m = Module()
        m.submodules.tx, m.submodules.rx = self.tx, self.rx
        m.d.comb += self.rx.rx.eq(self.tx.tx)
        return m


def simulate(dut, testbench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()


@pytest.mark.parametrize("divisor", [4, 5, 8])
def test_loopback_random_bytes(divisor):
    rng = np.random.default_rng(divisor)
    payload = [int(b) for b in rng.integers(0, 256, 24)] + [0x00, 0xFF, 0x55, 0xAA]
    gaps = [int(g) for g in rng.integers(0, 3 * divisor, len(payload))]
    dut = Loopback(divisor)
    received, errors = [], []

    async def testbench(ctx):
        queue = list(zip(payload, gaps))
        wait = 0
        for _ in range(len(payload) * 10 * divisor + sum(gaps) + 4 * divisor):
            if queue and wait == 0 and not ctx.get(dut.tx.data.valid):
                ctx.set(dut.tx.data.payload, queue[0][0])
                ctx.set(dut.tx.data.valid, 1)
            ctx.set(dut.rx.data.ready, int(rng.integers(0, 2)))     # slow, but keeps up
            if ctx.get(dut.rx.data.valid) and ctx.get(dut.rx.data.ready):
                received.append(ctx.get(dut.rx.data.payload))
            if ctx.get(dut.rx.error) or ctx.get(dut.rx.overrun):
                errors.append(ctx.get(dut.rx.error))
            accepted = ctx.get(dut.tx.data.valid) and ctx.get(dut.tx.data.ready)
            await ctx.tick()
            wait = max(wait - 1, 0)
            if accepted:
                ctx.set(dut.tx.data.valid, 0)
                wait = queue.pop(0)[1]

    simulate(dut, testbench)
    assert received == payload
    assert errors == []


@pytest.mark.parametrize("divisor", [4, 7])
def test_tx_bit_timing_and_backpressure(divisor):
    rng = np.random.default_rng(10 + divisor)
    payload = [int(b) for b in rng.integers(0, 256, 12)]
    # Mostly back to back (valid held high), sometimes a pause after the transfer.
    pauses = [int(rng.choice([0, 0, 1, 3 * divisor])) for _ in payload]
    dut = UartTx(divisor)
    line, ready, accepts = [], [], []

    async def testbench(ctx):
        queue, wait = list(zip(payload, pauses)), 0
        for cycle in range(len(payload) * 10 * divisor + sum(pauses) + 3 * divisor):
            ctx.set(dut.data.valid, int(bool(queue) and wait == 0))
            if queue:
                ctx.set(dut.data.payload, queue[0][0])
            line.append(ctx.get(dut.tx))
            ready.append(ctx.get(dut.data.ready))
            accepted = ctx.get(dut.data.valid) and ctx.get(dut.data.ready)
            await ctx.tick()
            wait = max(wait - 1, 0)
            if accepted:
                accepts.append(cycle)
                wait = queue.pop(0)[1]

    simulate(dut, testbench)
    assert len(accepts) == len(payload)
    expected_line, expected_ready = [1] * len(line), [1] * len(line)
    for cycle, byte in zip(accepts, payload):
        levels = uart_levels(byte, divisor)
        expected_line[cycle + 1:cycle + 1 + len(levels)] = levels
        expected_ready[cycle + 1:cycle + len(levels)] = [0] * (len(levels) - 1)
    assert line == expected_line[:len(line)]
    assert ready == expected_ready[:len(ready)]
    # Back-to-back bytes follow each other without idle time: one byte per 10 bit times.
    assert any(b - a == 10 * divisor for a, b in zip(accepts, accepts[1:]))


def run_rx(divisor, levels, ready=None):
    """Drive ``levels`` on the pin of a UartRx; return the accepted bytes with their cycle, and
    the cycles of ``error`` and ``overrun`` pulses."""
    dut = UartRx(divisor)
    got, errors, overruns = [], [], []

    async def testbench(ctx):
        for cycle, level in enumerate(levels + [1] * 4 * divisor):
            ctx.set(dut.rx, level)
            ctx.set(dut.data.ready, 1 if ready is None else ready(cycle))
            if ctx.get(dut.data.valid) and ctx.get(dut.data.ready):
                got.append(ctx.get(dut.data.payload))
            if ctx.get(dut.error):
                errors.append(cycle)
            if ctx.get(dut.overrun):
                overruns.append(cycle)
            await ctx.tick()

    simulate(dut, testbench)
    return got, errors, overruns


@pytest.mark.parametrize("divisor", [4, 8])
def test_rx_rejects_false_start_and_tolerates_glitch(divisor):
    rng = np.random.default_rng(20 + divisor)
    payload = [int(b) for b in rng.integers(0, 256, 8)]
    levels = [1] * 3
    for byte in payload:
        # A low pulse shorter than half a bit is a glitch, not a start bit.
        levels += [0] * int(rng.integers(1, divisor // 2)) + [1] * divisor
        char = uart_levels(byte, divisor)
        # One-cycle glitch at the start of data bit 3, away from its mid-bit sample point.
        char[4 * divisor] ^= 1
        levels += char + [1] * int(rng.integers(0, divisor))
    got, errors, overruns = run_rx(divisor, levels)
    assert (got, errors, overruns) == (payload, [], [])


@pytest.mark.parametrize("divisor", [4, 6])
def test_rx_framing_error_drops_byte_and_pulses_error(divisor):
    levels = uart_levels(0x3C, divisor)
    bad_start = len(levels)
    levels += uart_levels(0xC3, divisor, stop=0)
    levels += [0] * 25 * divisor                 # a break: the line stays low for a while
    levels += [1] * divisor + uart_levels(0x81, divisor, stop=0)
    levels += [1] * divisor + uart_levels(0x7E, divisor)
    got, errors, overruns = run_rx(divisor, levels)
    assert got == [0x3C, 0x7E]
    assert len(errors) == 2 and overruns == []
    # The stop bit is sampled in its middle, after the two-flop synchronizer.
    assert errors[0] == bad_start + 9 * divisor + divisor // 2 + 3


def test_rx_overrun_keeps_waiting_byte():
    divisor = 4
    levels = uart_levels(0x11, divisor) + uart_levels(0x22, divisor) + uart_levels(0x33, divisor)
    stall_end = 28 * divisor                       # not ready until byte 2 has completed
    got, errors, overruns = run_rx(divisor, levels, ready=lambda cycle: cycle >= stall_end)
    assert got == [0x11, 0x33]
    assert errors == [] and len(overruns) == 1


@pytest.mark.parametrize("cls", [UartTx, UartRx])
@pytest.mark.parametrize("divisor", [3, 0, -8, 4.0, True])
def test_divisor_must_be_integer_at_least_4(cls, divisor):
    with pytest.raises(ValueError, match=r"^UART divisor must be an integer of at least 4 clock "
                                         rf"cycles per bit, not {re.escape(repr(divisor))}$"):
        cls(divisor)
