"""cocotb testbench of the whole board design: bytes in over the UART pins, results out.

The host side is :class:`hwonnx.boards.protocol.Client`, the same code ``hwonnx run`` uses
with a serial port; here its transport drives the simulated ``rx`` pin and decodes ``tx``.
The client runs in a cocotb bridge thread, so its blocking calls wait on simulated time.
"""

import json
import os
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.task import bridge, resume
from cocotb.triggers import ClockCycles, Event, FallingEdge

from hwonnx.boards.host import run_samples, send_external, send_program
from hwonnx.boards.protocol import Client
from hwonnx.config import ArchConfig

__all__ = ["SimUart", "system_run"]


class SimUart:
    """A transport (``write(bytes)``, ``read(n)``) over the UART pins of the simulated top,
    ``divisor`` clock cycles per bit, 8N1."""

    def __init__(self, dut, divisor: int):
        self.dut, self.divisor = dut, divisor
        self.received = bytearray()
        self.arrived = Event()
        cocotb.start_soon(self._monitor())

    async def _send(self, data: bytes) -> None:
        for byte in data:
            for bit in [0] + [(byte >> i) & 1 for i in range(8)] + [1]:
                self.dut.rx.value = bit
                await ClockCycles(self.dut.clk, self.divisor)

    async def _monitor(self) -> None:
        while True:
            await FallingEdge(self.dut.tx)
            await ClockCycles(self.dut.clk, self.divisor // 2)
            if int(self.dut.tx.value) != 0:
                continue                               # a glitch, not a start bit
            byte = 0
            for i in range(8):
                await ClockCycles(self.dut.clk, self.divisor)
                byte |= int(self.dut.tx.value) << i
            await ClockCycles(self.dut.clk, self.divisor)
            self.received.append(byte)
            self.arrived.set()

    async def _receive(self, count: int) -> bytes:
        while len(self.received) < count:
            self.arrived.clear()
            await self.arrived.wait()
        data = bytes(self.received[:count])
        del self.received[:count]
        return data

    def write(self, data: bytes) -> None:
        resume(self._send)(bytes(data))

    def read(self, count: int) -> bytes:
        return resume(self._receive)(count)


@cocotb.test()
async def system_run(dut):
    """Check the board's identity, then for each sample: write the input words, run, read
    the output words. Writes ``results.json`` for the Python side to compare with golden."""
    job = json.loads(Path(os.environ["HWONNX_SYSTEM_JOB"]).read_text())
    config = ArchConfig.from_json(job["config"])
    Clock(dut.clk, 10, unit="ns").start()
    dut.rx.value = 1
    dut.rst.value = 1
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 4)
    uart = SimUart(dut, job["divisor"])

    def host() -> dict:
        client = Client(uart)
        info = client.verify(config, job["build_id"])
        send_program(client, config, [int(w, 16) for w in job["program"]])
        send_external(client, config, [int(w, 16) for w in job["ext"]])
        outputs, cycles = run_samples(client, config, job["in_places"], job["reads"],
                                      [[bytes.fromhex(s) for s in sample]
                                       for sample in job["inputs"]], job["cycles"])
        status = client.status()
        return {"info": repr(info), "outputs": [[o.hex() for o in sample] for sample in outputs],
                "cycles": cycles,
                "done": bool(status.done)}

    result = await bridge(host)()
    Path(job["results"]).write_text(json.dumps(result))
