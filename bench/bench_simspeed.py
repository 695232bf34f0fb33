"""Simulation-speed benchmark (#40): steady Verilator cycles/s of the 8x8 and 16x16 arrays for
each build lever alone, then the chosen combinations, with a profile of where the time goes.

Each flag set gets its own Verilator build (of the same accelerator Verilog, generated once per
array at the start, so HDL edits made meanwhile do not mix in), kept in ``--cache`` (default
``<hwonnx cache>/simspeed``) under a key of the sources, flags and toolchain. The workload is
the spine's 3x3 convolution (``bench_spine.py``) on random inputs: steady cycles/s is the
difference of a 1-sample run and a (1 + N)-sample run, cycles over process wall time, which
leaves out the start-up of the simulator. Every long run is checked bit-exact against the
golden model and each sample's cycles against the prediction. Each measurement is repeated
(``--repeat``) and its spread reported: the machine is shared.

The levers: Verilator's ``-O3``, ``--x-assign fast``, ``--x-initial fast``, ``--noassert``,
``--no-public-flat-rw``, ``--output-split-cfuncs``, ``--inline-mult``, the C++ optimization of
the model (``OPT_FAST``/``OPT_GLOBAL``), the harness's reset (a delay or a counter on the
clock), its clock: ``always #5`` under ``--timing`` in cocotb's Verilator main (hwonnx before
#40's last step) or in a plain C++ main, driven by a C++ main (``SIM_MAIN`` of
``sim/harness.py``, what hwonnx runs now), per-cycle Python (a cocotb coroutine toggling the
clock) or cocotb's own (GPI) clock. Run by hand:
``python bench/bench_simspeed.py`` (about half an hour: some 30 builds, built one at a time,
single job; ``--only NAME ...`` measures some flag sets).
"""

import argparse
import contextlib
import hashlib
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cocotb  # noqa: E402
from cocotb.triggers import RisingEdge, Timer  # noqa: E402

#: Verilator options of the harness build before #40's speed work (sim/runner.py then).
BASE_ARGS = ("-Wno-fatal", "--no-public-flat-rw", "-O3", "--timing", "--x-assign", "fast",
             "--x-initial", "fast", "-CFLAGS", "-fcoroutines")
#: make variables of that build (the model's C++ optimization).
BASE_MAKE = (("CFG_CXXFLAGS_PCH_I", "-include"), ("OPT_FAST", "-O2"), ("OPT_GLOBAL", "-O2"))

#: The harness's reset and clock: ``delay`` (``initial #25 rst = 0`` and ``always #5``, before
#: #40), ``counter`` (the reset released by a counter on the clock, ``always #5``), ``input``
#: (the counter, ``clk`` a port driven from outside: a C++ main or cocotb; sim/harness.py now).
_DELAY_RESET = "  initial #25 rst = 0;\n"
_COUNTER_RESET = ("  reg [1:0] rst_count = 0;\n", "  always @(posedge clk) if (rst_count != 2) "
                  "rst_count <= rst_count + 1; else rst <= 0;\n")

#: The C++ mains: ``cxx`` is hwonnx's own (``SIM_MAIN`` of sim/harness.py, the clock from
#: C++); ``cxxtiming`` runs a harness clocked by ``always #5`` (--timing) without cocotb: it
#: evaluates the model at each time slot of Verilator's timing scheduler. Both write the
#: seconds of their loop into +IMAGES/wall.txt.
MAIN_TIMING = r"""#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include "Vhwonnx_harness.h"
#include "verilated.h"
int main(int argc, char** argv) {
    const std::unique_ptr<VerilatedContext> ctx{new VerilatedContext};
    ctx->commandArgs(argc, argv);
    const std::unique_ptr<Vhwonnx_harness> top{new Vhwonnx_harness{ctx.get(), ""}};
    const auto started = std::chrono::steady_clock::now();
    while (!top->finished && !ctx->gotFinish()) {
        top->eval();
        if (!top->eventsPending()) break;
        ctx->time(top->nextTimeSlot());
    }
    const double seconds = std::chrono::duration<double>(
        std::chrono::steady_clock::now() - started).count();
    top->final();
    std::string dir = ctx->commandArgsPlusMatch("IMAGES=");
    if (dir.size() > 8) {
        FILE* f = std::fopen((dir.substr(8) + "/wall.txt").c_str(), "w");
        if (f) { std::fprintf(f, "%.6f\n", seconds); std::fclose(f); }
    }
    return 0;
}
"""


def main_cpp(main: str) -> str:
    from hwonnx.sim.harness import SIM_MAIN
    return {"cxx": SIM_MAIN, "cxxtiming": MAIN_TIMING}[main]


@dataclass(frozen=True)
class FlagSet:
    name: str
    what: str
    args: tuple = BASE_ARGS
    make: tuple = BASE_MAKE
    harness: str = "delay"      # delay | counter | input (see above)
    main: str = "cocotb"        # cocotb | cxx | cxxtiming (main_cpp) | pyclock | gpiclock
    long_samples: "dict[str, int]" = field(default_factory=lambda: {"8x8": 12, "16x16": 30})

    def make_string(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.make)


def _args(*, drop=(), add=(), replace=None) -> tuple:
    args = list(BASE_ARGS)
    for item in drop:
        i = args.index(item)
        del args[i:i + (2 if item in ("--x-assign", "--x-initial") else 1)]
    if replace:
        args = [replace.get(a, a) for a in args]
    return tuple(args) + tuple(add)


def _make(**changes) -> tuple:
    make = dict(BASE_MAKE)
    for k, v in changes.items():
        if v is None:
            make.pop(k, None)
        else:
            make[k] = v
    return tuple(make.items())


def _adopted() -> FlagSet:
    """sim/runner.py's flags and sim/harness.py's harness and main now."""
    from hwonnx.sim import runner
    make = tuple(tuple(item.split("=", 1)) for item in runner.MAKEFLAGS.split())
    return FlagSet("adopted", "sim/runner.py + sim/harness.py now: " + " ".join(
        runner.ACCEL_ARGS[1:]) + ", the clock from its C++ main", tuple(runner.ACCEL_ARGS),
        make, "input", "cxx")


def flag_sets() -> "list[FlagSet]":
    from hwonnx.sim import runner

    cxx_args = tuple(a for a in BASE_ARGS if a not in ("--timing", "-CFLAGS", "-fcoroutines"))
    short = {"8x8": 1, "16x16": 2}
    adopted = _adopted()
    make = adopted.make
    sets = [
        FlagSet("baseline", "before #40: " + " ".join(BASE_ARGS[1:]) + ", OPT_FAST=-O2"),
        FlagSet("no -O3", "Verilator's default optimization (no -O3)", _args(drop=("-O3",))),
        FlagSet("-O0", "Verilator -O0 instead of -O3", _args(replace={"-O3": "-O0"})),
        FlagSet("x-assign default", "no --x-assign fast", _args(drop=("--x-assign",))),
        FlagSet("x-initial unique", "no --x-initial fast (Verilator's default: unique)",
                _args(drop=("--x-initial",))),
        FlagSet("--noassert", "--noassert", _args(add=("--noassert",))),
        FlagSet("public-flat-rw", "every signal public (cocotb's runner default: no "
                "--no-public-flat-rw)", _args(drop=("--no-public-flat-rw",))),
        FlagSet("--inline-mult 0", "--inline-mult 0 (inline every module)",
                _args(add=("--inline-mult", "0"))),
        FlagSet("--output-split-cfuncs 500", "functions split at 500 statements",
                _args(add=("--output-split-cfuncs", "500"))),
        FlagSet("OPT_FAST=-Os", "C++ -Os (Verilator's default)", _args(),
                _make(OPT_FAST="-Os", OPT_GLOBAL="-Os")),
        FlagSet("OPT_FAST=-O1", "C++ -O1", _args(), _make(OPT_FAST="-O1")),
        FlagSet("OPT_FAST=-O3", "C++ -O3", _args(), _make(OPT_FAST="-O3")),
        FlagSet("OPT_FAST=-O2 -fno-plt", "C++ -O2 -fno-plt -fno-semantic-interposition",
                _args(), _make(OPT_FAST="-O2 -fno-plt -fno-semantic-interposition")),
        FlagSet("counter reset", "the reset released by a counter on the clock, not a delay",
                harness="counter"),
        FlagSet("C++ clock", "no --timing: the clock from a C++ main (no cocotb)", cxx_args,
                harness="input", main="cxx"),
        FlagSet("per-cycle Python", "a cocotb coroutine toggles the clock (no --timing)",
                cxx_args, harness="input", main="pyclock", long_samples=short),
        FlagSet("cocotb GPI clock", "cocotb's Clock (GPI, no Python per edge; no --timing)",
                cxx_args, harness="input", main="gpiclock", long_samples=short),
        FlagSet("cocotb + --timing", "hwonnx before the C++ main: always #5 under --timing in "
                "cocotb's Verilator main, the counter reset, " + " ".join(
                    runner.BUILD_ARGS[1:]), tuple(runner.BUILD_ARGS), make, "counter"),
        FlagSet("C++ main + --timing", "always #5 under --timing, a plain C++ main (no VPI, "
                "no cocotb): the timing scheduler's share", tuple(runner.BUILD_ARGS), make,
                "counter", "cxxtiming"),
        adopted,
        FlagSet("adopted --noassert", "adopted + --noassert",
                adopted.args + ("--noassert",), make, "input", "cxx"),
        FlagSet("adopted OPT_FAST=-O3", "adopted, the model in C++ -O3",
                adopted.args, _make(OPT_FAST="-O3"), "input", "cxx"),
        FlagSet("adopted --output-split-cfuncs 2000", "adopted, functions split at 2000 "
                "statements", adopted.args + ("--output-split-cfuncs", "2000"), make, "input",
                "cxx"),
    ]
    return sets


# -- cocotb testbenches of the pyclock/gpiclock builds (imported by the simulator) ----------

@cocotb.test()
async def run_clocked(dut):
    """Drive ``clk`` from cocotb (``SIMSPEED_CLOCK``: ``python`` toggles it in a coroutine,
    ``gpi`` uses cocotb's Clock, ``none``: the harness clocks itself, ``always #5``) until the
    harness has finished."""
    started = time.perf_counter()
    if os.environ.get("SIMSPEED_CLOCK") == "none":
        pass
    elif os.environ.get("SIMSPEED_CLOCK") == "gpi":
        from cocotb.clock import Clock
        Clock(dut.clk, 10, unit="ns").start()
    else:
        async def toggle():
            while True:
                dut.clk.value = 0
                await Timer(5, unit="ns")
                dut.clk.value = 1
                await Timer(5, unit="ns")
        cocotb.start_soon(toggle())
    await RisingEdge(dut.finished)
    Path(cocotb.plusargs["IMAGES"], "wall.txt").write_text(
        f"{time.perf_counter() - started:.6f}\n")


# -- builds ----------------------------------------------------------------------------------

def harness_text(config, kind: str) -> str:
    from hwonnx.sim.harness import harness_verilog
    text = harness_verilog(config)
    port = "(input clk, output reg finished);"
    if not all(line in text for line in _COUNTER_RESET) or port not in text:
        raise RuntimeError("sim/harness.py's clock and reset are not those this benchmark "
                           "expects")
    if kind == "input":
        return text
    text = text.replace(port, "(output reg finished);\n  reg clk = 0;\n"
                        "  always #5 clk = ~clk;")
    if kind == "delay":
        return text.replace(_COUNTER_RESET[0], "").replace(_COUNTER_RESET[1], _DELAY_RESET)
    return text


def build(flags: FlagSet, config, accel: str, cache: Path, prof: bool = False) -> Path:
    """The folder of ``flags``' build of ``accel`` (built unless cached); its binary is
    ``hwonnx_harness``."""
    from hwonnx.sim import runner
    from hwonnx.sim.harness import HARNESS_TOP

    harness = harness_text(config, flags.harness)
    args = list(flags.args) + (["--prof-cfuncs"] if prof else [])
    ports = ("finished",) + (("clk",) if flags.harness == "input" else ())
    vlt = "`verilator_config\n" + "".join(
        f'public_flat_rw -module "{HARNESS_TOP}" -var "{p}"\n' for p in ports)
    main = flags.main in ("cxx", "cxxtiming")
    key = hashlib.sha256("\0".join([accel, harness, vlt, " ".join(args), flags.make_string(),
                                    main_cpp(flags.main) if main else "cocotb",
                                    runner.toolchain_fingerprint()]).encode()).hexdigest()[:16]
    folder = cache / f"{config.rows}x{config.cols}-{'cxx' if main else 'cocotb'}-{key}"
    if (folder / HARNESS_TOP).exists():
        return folder
    runner.setup_verilator()
    work = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=cache))
    for name, text in (("accel.v", accel), ("harness.v", harness), ("public.vlt", vlt)):
        (work / name).write_text(text)
    sources = [work / "public.vlt", work / "accel.v", work / "harness.v"]
    env = dict(os.environ, MAKEFLAGS=flags.make_string())
    started = time.monotonic()
    log = work / "build.log"
    if main:
        (work / "main.cpp").write_text(main_cpp(flags.main))
        command = ["verilator", "--cc", "--exe", "--build", "-j", "1", "--top-module",
                   HARNESS_TOP, "--Mdir", str(work / "obj"), "-o", HARNESS_TOP,
                   "--timescale", "1ns/1ps", *args, *map(str, sources), str(work / "main.cpp")]
        with open(log, "w") as out:
            done = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        if done.returncode:
            raise RuntimeError(f"Build of {flags.name} failed: see {log}")
    else:
        import cocotb_tools.runner as cocotb_tools_runner
        saved = os.environ.get("MAKEFLAGS"), cocotb_tools_runner.MAX_PARALLEL_BUILD_JOBS
        os.environ["MAKEFLAGS"] = flags.make_string()
        cocotb_tools_runner.MAX_PARALLEL_BUILD_JOBS = 1      # one job: the machine is shared
        try:
            with runner.cocotb_runner() as cocotb_run:
                cocotb_run.build(sources=sources, hdl_toplevel=HARNESS_TOP,
                                 build_dir=work / "obj", build_args=args,
                                 timescale=("1ns", "1ps"), log_file=log)
        finally:
            os.environ["MAKEFLAGS"] = saved[0] or ""
            cocotb_tools_runner.MAX_PARALLEL_BUILD_JOBS = saved[1]
    (work / "build_seconds").write_text(f"{time.monotonic() - started:.1f}\n")
    shutil.rmtree(folder, ignore_errors=True)
    (work / "obj" / HARNESS_TOP).rename(work / HARNESS_TOP)
    if not prof:
        shutil.rmtree(work / "obj")
    work.rename(folder)
    return folder


# -- runs ------------------------------------------------------------------------------------

def _simulator(flags: FlagSet, run=None):
    """What :func:`hwonnx.sim.runner.run_rtl` calls to run a build of ``flags``
    (``runner.run_simulator``): a C++ main's binary as hwonnx runs it (``run``: another way),
    a cocotb build with this module's testbench."""
    from hwonnx.sim import runner

    if flags.main in ("cxx", "cxxtiming"):
        return run or runner.run_simulator
    clock = {"gpiclock": "gpi", "pyclock": "python", "cocotb": "none"}[flags.main]

    def cocotb_run(build_dir, args, folder, log_file):
        from hwonnx.sim.harness import HARNESS_TOP
        try:
            with runner.cocotb_runner() as cocotb_run:
                cocotb_run.test(test_module="bench_simspeed", hdl_toplevel=HARNESS_TOP,
                                hdl_toplevel_lang="verilog", build_dir=build_dir,
                                test_dir=folder, plusargs=args, log_file=log_file,
                                results_xml=str(Path(folder) / "results.xml"),
                                extra_env={"COCOTB_LOG_LEVEL": "WARNING",
                                           "SIMSPEED_CLOCK": clock})
        except (SystemExit, Exception):
            return 1
        return 0
    return cocotb_run


@contextlib.contextmanager
def using(flags: FlagSet, folder: Path, run=None):
    """Make :func:`hwonnx.sim.execute_rtl` run ``folder``'s build of ``flags``."""
    from hwonnx.sim import runner

    saved = runner.rtl_build, runner.run_simulator
    runner.rtl_build = lambda *args, **kwargs: folder
    runner.run_simulator = _simulator(flags, run)
    try:
        yield
    finally:
        runner.rtl_build, runner.run_simulator = saved


@dataclass
class Workload:
    array: str
    config: object
    program: object
    accel: str
    inputs: np.ndarray          # int8, [S, ...]
    golden: np.ndarray          # int8 outputs of the golden model
    predicted: int


def workload(array: str, config, samples: int) -> Workload:
    from models import calibration, conv_layer_model

    from hwonnx.api import quantize_inputs, build as compile_model, simulate
    from hwonnx.compiler.timing import predict
    from hwonnx.sim.runner import accelerator_verilog

    model = conv_layer_model()
    result = compile_model(model, None, config=config, calib=calibration(model, 32),
                           log=quiet)
    raw = calibration(model, samples, seed=5)
    program = result.program
    inputs = quantize_inputs(result.graph, program, raw)[program.input_value]
    golden = simulate(result, raw, mode="golden", log=quiet)
    return Workload(array, config, program, accelerator_verilog(config, log=quiet), inputs,
                    next(iter(golden.int_values.values())),
                    predict(program.expanded(), config).total)


def quiet(message):
    pass


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(flags: FlagSet, work: Workload, folder: Path, repeat: int) -> dict:
    """Steady cycles/s of ``folder``'s build: the difference of a 1-sample and a (1 + N)-sample
    run, over the simulator process's CPU time (user + system, which another program on the
    machine changes little) and over its wall time (as ``bench_spine.py``)."""
    from hwonnx.sim import execute_rtl

    n = flags.long_samples[work.array]
    by_cpu, by_wall, exact = [], [], True
    with using(flags, folder):
        for _ in range(repeat):
            runs = {}
            for count in (1, 1 + n):
                cpu = _child_cpu()
                outputs, run = execute_rtl(work.program, work.inputs[:count], log=quiet)
                runs[count] = run, _child_cpu() - cpu
                exact &= bool(np.array_equal(outputs.reshape(work.golden[:count].shape),
                                             work.golden[:count])
                              and all(c == work.predicted for c in run.cycles))
            (short, short_cpu), (long, long_cpu) = runs[1], runs[1 + n]
            cycles = long.total_cycles - short.total_cycles
            by_cpu.append(cycles / max(long_cpu - short_cpu, 1e-9))
            by_wall.append(cycles / max(long.wall_seconds - short.wall_seconds, 1e-9))
    if not exact:
        raise RuntimeError(f"{flags.name} on {work.array}: outputs or cycles differ from the "
                           f"golden model and the prediction")
    build_seconds = (folder / "build_seconds").read_text().strip() \
        if (folder / "build_seconds").exists() else "?"
    median = float(np.median(by_cpu))
    return {"flag_set": flags.name, "what": flags.what, "array": work.array,
            "verilator_args": list(flags.args), "make": flags.make_string(),
            "harness": flags.harness, "main": flags.main, "long_samples": 1 + n,
            "steady_cycles_per_cpu_second": [round(s) for s in by_cpu],
            "steady_cycles_per_wall_second": [round(s) for s in by_wall],
            "median": round(median), "spread": round((max(by_cpu) - min(by_cpu)) / median, 3),
            "median_wall": round(float(np.median(by_wall))),
            "bit_exact": exact, "build_seconds": build_seconds,
            "binary_kb": round((folder / "hwonnx_harness").stat().st_size / 1024)}


# -- profile ---------------------------------------------------------------------------------

def profile(flags: FlagSet, work: Workload, cache: Path) -> dict:
    """perf's samples of a ``--prof-cfuncs`` build of ``flags`` (C++ main) on the long run, by
    function and by module of the accelerator (a ``--prof-cfuncs`` function is named after the
    Verilog line it comes from)."""
    if shutil.which("perf") is None:
        return {"error": "perf not found"}
    from hwonnx.sim import execute_rtl

    folder = build(flags, work.config, work.accel, cache, prof=True)
    perf_data = folder / "perf.data"

    def record(build_dir, args, folder, log_file):
        command = ["perf", "record", "-q", "-F", "2000", "-o", str(perf_data),
                   str(Path(build_dir) / "hwonnx_harness"), *args]
        with open(log_file, "w") as out:
            return subprocess.run(command, cwd=folder, stdout=out,
                                  stderr=subprocess.STDOUT).returncode

    with using(flags, folder, record):
        execute_rtl(work.program, work.inputs[:1 + flags.long_samples[work.array]], log=quiet)
    report = subprocess.run(["perf", "report", "-i", str(perf_data), "--no-children",
                             "--sort", "symbol", "--stdio", "-g", "none"],
                            capture_output=True, text=True).stdout
    starts = [(i + 1, m.group(1)) for i, line in enumerate(work.accel.splitlines())
              if (m := re.match(r"\s*module\s+\\?([^\s(;]+)", line))]
    lines_at = [s for s, _ in starts]
    import bisect
    by_module, by_region, functions = {}, {}, []
    for line in report.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+\[.\]\s+(\S+)", line)
        if not m:
            continue
        share, symbol = float(m.group(1)), m.group(2)
        functions.append((symbol, share))
        p = re.search(r"___(\w+?)_sequent__TOP__\d+__PROF__(\w+?)__l(\d+)", symbol)
        if p and p.group(2) == "accel":
            i = bisect.bisect_right(lines_at, int(p.group(3))) - 1
            module = ".".join(starts[i][1].split(".")[:2]) if i >= 0 else "?"
            module = re.sub(r"_\d+$", "_*", module)
        elif p:
            module = "harness"
        elif "024root" in symbol:
            module = "eval/scheduling glue: " + re.sub(r"__\d+$", "", symbol.split(
                "___024root___")[-1])
        else:
            module = "Verilator runtime, libc"
        by_module[module] = by_module.get(module, 0.0) + share
        if p:
            by_region[p.group(1)] = by_region.get(p.group(1), 0.0) + share
    def top(d, n):
        return [[k, round(v, 2)] for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:n]]

    return {"flag_set": flags.name, "array": work.array, "modules": top(by_module, 12),
            "regions": top(by_region, 4), "functions": [[s, round(v, 2)] for s, v in
                                                        functions[:10]]}


# -- output ----------------------------------------------------------------------------------

def markdown(results, profiles, machine) -> str:
    arrays = sorted({r["array"] for r in results}, key=lambda a: int(a.split("x")[0]))
    names = list(dict.fromkeys(r["flag_set"] for r in results))
    by = {(r["flag_set"], r["array"]): r for r in results}
    # the reference of "vs base": the baseline if measured, else hwonnx before the C++ main
    reference = next((n for n in ("baseline", "cocotb + --timing") if n in names), names[0])
    base = {a: by.get((reference, a), {}).get("median") for a in arrays}
    lines = ["# Simulation speed", "",
             "Generated by `python bench/bench_simspeed.py`. Steady cycles/s of the spine's "
             "3x3 convolution (random inputs; every long run bit-exact with the golden model, "
             "every sample's cycles as predicted): (cycles of a (1 + N)-sample run - cycles "
             "of a 1-sample run) / (difference of the simulator processes' CPU time, user + "
             "system), median of the repeats; spread = (max - min) / median. CPU time, not "
             "wall time: the machine is shared (wall-time numbers, as `bench_spine.py` "
             "measures them, are in the JSON, `median_wall`). One flag set changed from the "
             "baseline at a time, then the adopted set and its variants. Builds: one at a time, "
             "one make job, no -march=native, one simulation thread. \"vs base\": against "
             f"`{reference}`.", "", f"Machine: {machine}", "",
             "| flag set | what | " + " | ".join(f"{a} cycles/s | {a} vs base | {a} spread"
                                                for a in arrays) + " |",
             "|---|---|" + "---:|---:|---:|" * len(arrays)]
    for name in names:
        row = [name, next(r["what"] for r in results if r["flag_set"] == name)]
        for a in arrays:
            r = by.get((name, a))
            if r is None:
                row += ["", "", ""]
                continue
            ratio = f"{r['median'] / base[a]:.2f}x" if base[a] else ""
            row += [f"{r['median']:,}", ratio, f"{r['spread']:.1%}"]
        lines.append("| " + " | ".join(row) + " |")
    for p in profiles:
        if "error" in p:
            lines += ["", f"Profile: {p['error']}"]
            continue
        lines += ["", f"## Profile: {p['flag_set']} on {p['array']}", "",
                  "perf samples of a `--prof-cfuncs` build (C++ main), by module of the "
                  "accelerator (`_*`: every instance) and Verilator's scheduling regions:", "",
                  "| module | share |", "|---|---:|"]
        lines += [f"| {m} | {s:.1f}% |" for m, s in p["modules"]]
        lines += ["", "Regions: " + ", ".join(f"{m} {s:.1f}%" for m, s in p["regions"]),
                  "", "Top functions: " + "; ".join(f"`{f}` {s:.1f}%"
                                                     for f, s in p["functions"][:6])]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from results_io import RESULTS, measured_commit, write_results

    from hwonnx.config import PRESETS
    from hwonnx.sim.runner import cache_root

    arrays = {"8x8": PRESETS["small"], "16x16": PRESETS["large"]}
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--cache", type=Path, default=None)
    parser.add_argument("--arrays", nargs="*", default=list(arrays), choices=list(arrays))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None, help="flag-set names")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--dry", action="store_true", help="do not write the results")
    args = parser.parse_args(argv)
    cache = args.cache or cache_root() / "simspeed"
    cache.mkdir(parents=True, exist_ok=True)
    sets = [f for f in flag_sets() if args.only is None or f.name in args.only]
    commit = measured_commit()
    machine = (f"{os.cpu_count()} CPUs ({_cpu()}), load average at the start "
               f"{os.getloadavg()[0]:.1f}; measured at {commit}")
    results, profiles = [], []
    for array in args.arrays:
        most = max(f.long_samples[array] for f in sets) + 1
        work = workload(array, arrays[array], most)
        print(f"{array}: predicted {work.predicted:,} cycles a sample", flush=True)
        for flags in sets:
            folder = build(flags, work.config, work.accel, cache)
            r = measure(flags, work, folder, args.repeat)
            results.append(r)
            steady = ", ".join(f"{s:,}" for s in r["steady_cycles_per_cpu_second"])
            print(f"  {flags.name:28s} {r['median']:>12,} cycles/CPU-s  spread "
                  f"{r['spread']:.1%}  ({steady}"
                  f"; wall {r['median_wall']:,}; build {r['build_seconds']} s)", flush=True)
        if not args.no_profile:
            chosen = next((f for f in sets if f.name == "adopted"), None)
            if chosen is not None:
                profiles.append(profile(chosen, work, cache))
                print(f"  profile: {profiles[-1].get('modules', profiles[-1])[:5]}", flush=True)
    if not args.dry:
        write_results(args.out, "simspeed", [{"machine": machine}] + results
                      + [{"profile": p} for p in profiles], markdown(results, profiles, machine))
    return 0


def _cpu() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "?"


if __name__ == "__main__":
    sys.exit(main())
