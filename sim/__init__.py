"""Cycle-accurate simulation of the accelerator on Verilator (``hwonnx.sim``): the accelerator
in a Verilog harness, clocked by a C++ main (``runner``, ``harness``); the board design under
cocotb (``system``, ``tb_system``).

The names below are imported on first use: a cocotb simulator process imports its testbench
(``hwonnx.sim.tb_system``) through this package, and importing the runner there (Amaranth, the
compiler) tripled the start-up of every run: 3.4 s instead of 1.0 s for a one-sample run.
"""

from importlib import import_module

__all__ = ["RunResult", "cache_root", "execute_program", "execute_rtl", "rtl_build", "run_rtl",
           "setup_verilator"]

_HOME = {"execute_program": ".execute", "execute_rtl": ".execute", "RunResult": ".runner",
         "cache_root": ".runner", "rtl_build": ".runner", "run_rtl": ".runner",
         "setup_verilator": ".runner"}


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_HOME[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
