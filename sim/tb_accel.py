"""cocotb testbench: clock, reset, then one wait for the harness to finish.

The harness (``harness.py``) loads every buffer and runs every sample in Verilog, so Python
wakes up only at the start and at the end of the run, and the simulation runs at Verilator
speed. Results are files the harness writes; :mod:`hwonnx.sim.runner` reads them.
"""

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge

__all__ = ["run_program"]


@cocotb.test()
async def run_program(dut):
    """Reset the harness and wait until it reports that every sample has run."""
    Clock(dut.clk, 10, unit="ns").start()
    dut.rst.value = 1
    await ClockCycles(dut.clk, 2)
    dut.rst.value = 0
    await RisingEdge(dut.finished)
