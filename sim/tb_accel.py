"""cocotb testbench: one wait for the harness to finish.

The harness (``harness.py``) loads every buffer and runs every sample in Verilog, so Python
wakes up only at the start and at the end of the run, and the simulation runs at Verilator
speed. Results are files the harness writes; :mod:`hwonnx.sim.runner` reads them.
"""

import cocotb
from cocotb.triggers import RisingEdge

__all__ = ["run_program"]


@cocotb.test()
async def run_program(dut):
    """Wait until the harness reports that every sample has run (it drives its own clock and
    reset, so Python is not woken on clock edges)."""
    await RisingEdge(dut.finished)
