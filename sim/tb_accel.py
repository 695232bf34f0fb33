"""cocotb testbench: one wait for the harness to finish.

The harness (``harness.py``) loads every buffer and runs every sample in Verilog, so Python
wakes up only at the start and at the end of the run, and the simulation runs at Verilator
speed. Results are files the harness writes; :mod:`hwonnx.sim.runner` reads them. This
testbench adds one: ``wall.txt``, the wall-clock seconds from its start to the harness's end,
which leave out the simulator's start-up (process, Verilator model, cocotb).
"""

import time
from pathlib import Path

import cocotb
from cocotb.triggers import RisingEdge

__all__ = ["run_program", "WALL_FILE"]

#: Written into the +IMAGES folder: the seconds :func:`run_program` waited.
WALL_FILE = "wall.txt"


@cocotb.test()
async def run_program(dut):
    """Wait until the harness reports that every sample has run (it drives its own clock and
    reset, so Python is not woken on clock edges)."""
    started = time.perf_counter()
    await RisingEdge(dut.finished)
    seconds = time.perf_counter() - started
    Path(cocotb.plusargs["IMAGES"], WALL_FILE).write_text(f"{seconds:.6f}\n")
