"""Cycle-accurate simulation of the accelerator with cocotb on Verilator (``hwonnx.sim``)."""

from .execute import execute_program, execute_rtl
from .runner import RunResult, cache_root, rtl_build, run_rtl, setup_verilator

__all__ = ["RunResult", "cache_root", "execute_program", "execute_rtl", "rtl_build", "run_rtl",
           "setup_verilator"]
