"""Waveform traces of RTL runs: ``hwonnx sim --trace out.vcd`` (or ``out.fst``, by the suffix).

A traced run uses its own Verilator build of the architecture (``--trace``, or
``--trace-fst`` for FST; a cache entry of its own, so untraced runs stay as fast), which dumps
every signal of the harness and the accelerator from time 0 through the last sample: the
buffers being loaded, then each sample. A trace grows with the cycles (about 2 KB a cycle in
VCD for a 3x5 array, a tenth of that in FST): trace a few samples. Two changes to the Verilog
of that build only (:func:`traced_sources`):

- Yosys's unnamed nets (``\\$12``, ``\\$auto$verilog_backend.cc:...``) get names with a leading
  underscore, which Verilator leaves out of traces: they have no name in the HDL, and GTKWave
  refuses to read a VCD file holding the ``$auto`` ones;
- the harness writes the simulation time of the clock edge at which the accelerator takes each
  sample's ``start`` (:data:`STARTS_FILE`), from which its ``cycles`` counter reads 0: the
  markers of the GTKWave save file written beside the trace (:mod:`hwonnx.sim.gtkw`) are
  placed from it.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

from ..errors import ToolchainError, UsageError

__all__ = ["trace_kind", "check_trace_path", "BUILD_ARGS", "traced_sources",
           "check_fst_toolchain", "run_args", "discard", "finish", "STARTS_FILE"]

#: The trace formats by file suffix.
_SUFFIXES = {".vcd": "vcd", ".fst": "fst"}
#: Verilator's options of a traced build, besides ``--trace``.
BUILD_ARGS = {"vcd": (), "fst": ("--trace-fst",)}
#: Written by a traced harness into its +IMAGES folder: one line per sample, the time in ns
#: of the rising clock edge at which the accelerator takes ``start``.
STARTS_FILE = "starts.txt"

_START_TIMES = """
  // Traced build (hwonnx.sim.trace): the time of the edge at which the accelerator takes
  // each sample's start, for the save file's markers.
  always @(posedge clk) if (start) begin : hwonnx_trace_start
    integer starts;
    starts = $fopen({dir, "/%s"}, "a");
    $fdisplay(starts, "%%0d", $time);
    $fclose(starts);
  end
""" % STARTS_FILE


def trace_kind(path) -> str:
    """``"vcd"`` or ``"fst"``, by the suffix of ``path``.

    Raises
    ------
    UsageError
        For any other suffix."""
    kind = _SUFFIXES.get(Path(path).suffix.lower())
    if kind is None:
        raise UsageError(f"--trace writes a .vcd or .fst file (chosen by the suffix), not "
                         f"'{path}'")
    return kind


def check_trace_path(path) -> Path:
    """``path`` if a trace can be written there (before a simulation that may take long).

    Raises
    ------
    UsageError
        For a suffix other than ``.vcd`` or ``.fst``, a folder, or a missing parent folder."""
    path = Path(path)
    trace_kind(path)
    if path.is_dir():
        raise UsageError(f"Cannot write the trace to '{path}': Is a directory")
    if not path.parent.is_dir():
        why = "Not a directory" if path.parent.exists() else "No such file or directory"
        raise UsageError(f"Cannot write the trace to '{path}': {why}")
    return path


def check_fst_toolchain() -> None:
    """Verilator's FST writer is compiled from source with LZ4 and zlib: check that their
    headers are there before a build that would fail on them.

    Raises
    ------
    ToolchainError
        Naming the packages to install."""
    compiler = shutil.which("g++") or "g++"
    probe = subprocess.run([compiler, "-fsyntax-only", "-x", "c++", "-"], input=(
        "#include <lz4.h>\n#include <zlib.h>\n"), capture_output=True, text=True)
    if probe.returncode != 0:
        raise ToolchainError("An FST trace needs the LZ4 and zlib libraries, which Verilator's "
                             "FST writer is compiled with: install them (Debian/Ubuntu: "
                             "'apt-get install liblz4-dev zlib1g-dev'), or trace to a .vcd "
                             "file")


def traced_sources(accel: str, harness: str) -> "tuple[str, str]":
    """The accelerator's and the harness's Verilog for a traced build (see the module)."""
    names: "dict[str, str]" = {}
    accel = re.sub(r"\\\$\S*", lambda m: names.setdefault(m.group(0), f"_hwonnx_net{len(names)}"),
                   accel)
    at = harness.rindex("endmodule")
    return accel, harness[:at] + _START_TIMES.lstrip("\n") + harness[at:]


def _partial(trace: Path) -> Path:
    """Where the simulator dumps ``trace`` (beside it; renamed into place when the run ends)."""
    return trace.absolute().with_name(f".{trace.name}.{os.getpid()}.tmp")


def run_args(trace: "Path | None") -> "list[str]":
    """The simulator's arguments that dump ``trace`` (none for None; its main,
    :data:`hwonnx.sim.harness.SIM_MAIN`, reads ``--trace-file``)."""
    if trace is None:
        return []
    return ["--trace-file", str(_partial(trace))]


def discard(trace: "Path | None") -> None:
    """Remove what a failed run dumped of ``trace``."""
    if trace is not None:
        _partial(trace).unlink(missing_ok=True)


def finish(trace: Path, folder: Path) -> "list[int]":
    """Move the dump of ``trace`` into place; returns the start times the harness wrote into
    ``folder`` (for its save file, :func:`hwonnx.sim.gtkw.write_save_file`)."""
    _partial(trace).replace(trace)
    starts = folder / STARTS_FILE
    return [int(t) for t in starts.read_text().split()] if starts.exists() else []
