"""Cycle-accurate simulation of the accelerator with cocotb on Verilator (``hwonnx.sim``)."""

from .runner import RunResult, cache_root, rtl_build, run_rtl, setup_verilator

__all__ = ["RunResult", "cache_root", "rtl_build", "run_rtl", "setup_verilator"]
from .execute import execute_rtl, truncate_program  # noqa: E402

__all__ += ["execute_rtl", "truncate_program"]
