"""``hwonnx sim --trace``: the waveforms of a run on the RTL and their GTKWave save file.

One digits_mlp build for the 3x5 array (the smallest of the RTL tests) runs one test image
with a VCD trace (one traced Verilator build for the module), read back with
``tests/vcd_reader.py``: ``done`` rises at the cycle the compiler predicted, the save file
names signals of the trace only, grouped by engine, and the report's cycle window of each
layer holds exactly the cycles the array is fed in that layer. The FST trace needs a second
traced build."""

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from hwonnx.api import simulate
from hwonnx.cli import main
from hwonnx.config import ArchConfig
from hwonnx.errors import ToolchainError, UsageError
from hwonnx.sim.gtkw import ENGINES, declared_signals, save_groups
from hwonnx.sim.harness import extmem_verilog, harness_verilog
from hwonnx.sim.runner import accelerator_verilog
from hwonnx.sim.trace import check_fst_toolchain
from host_steps_helpers import segmented_build
from vcd_reader import read_vcd

ACCEL = "hwonnx_harness.accel"
CLOCK, START, DONE = "hwonnx_harness.clk", f"{ACCEL}.host__start", f"{ACCEL}.host__done"
CYCLES, FED = f"{ACCEL}.host__cycles", f"{ACCEL}.feeder.act_en"
DISPATCHED = f"{ACCEL}.debug_dispatched"


def run(*argv) -> "tuple[int, str, str]":
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main([str(a) for a in argv])
    return code, stdout.getvalue(), stderr.getvalue()


@pytest.fixture(scope="module")
def build(tmp_path_factory, digits):
    """``hwonnx build digits_mlp --rows 3 --cols 5``, and one test image to run."""
    folder = tmp_path_factory.mktemp("trace")
    np.save(folder / "x.npy", digits["test_images"][:1])
    assert run("build", "digits_mlp", "-o", folder / "build", "--rows", 3, "--cols", 5)[0] == 0
    report = json.loads((folder / "build" / "report.json").read_text())
    return folder, report


@pytest.mark.rtl
def test_waves_in_the_environment_does_not_trace_a_run(build, monkeypatch):
    """cocotb's runner lets ``WAVES`` override whether it traces; hwonnx sets it aside, so a
    user's ``WAVES=1`` runs the untraced build as it is (it failed: "--trace requires the
    design to be built with trace support") and only ``--trace`` traces."""
    folder, report = build
    monkeypatch.setenv("WAVES", "1")
    before = set(folder.rglob("*"))
    code, stdout, stderr = run("sim", folder / "build", "--input", folder / "x.npy")
    assert code == 0, stderr
    assert f"{report['total']['predicted_cycles']:,} cycles per sample (predicted" in stdout
    assert os.environ["WAVES"] == "1"
    assert set(folder.rglob("*")) == before            # no trace written


@pytest.fixture(scope="module")
def traced(build):
    """``hwonnx sim build --input x.npy --trace run.vcd``: its output, the trace's signals
    this module reads, and the times (in the trace's units) of the clock edge at which the
    accelerator takes ``start`` and of ``done`` rising."""
    folder, report = build
    code, stdout, stderr = run("sim", folder / "build", "--input", folder / "x.npy", "--trace",
                               folder / "run.vcd")
    assert code == 0, stderr
    trace = read_vcd(folder / "run.vcd", {CLOCK, START, DONE, CYCLES, FED, DISPATCHED})
    clock = trace.rises(CLOCK)
    period = clock[1] - clock[0]
    assert all(later - earlier == period for earlier, later in zip(clock, clock[1:]))
    [start] = trace.rises(START)                # one sample: one start pulse
    # The harness raises start at a rising edge; the accelerator takes it at the next one,
    # from which its cycles counter counts (it reads 0 until the edge after).
    taken = next(time for time in clock if time > start)
    [done] = trace.rises(DONE)
    return {"folder": folder, "report": report, "stdout": stdout, "stderr": stderr,
            "trace": trace, "period": period, "start": start, "taken": taken, "done": done}


@pytest.mark.rtl
def test_done_rises_at_the_predicted_cycle(traced):
    """``done`` rises exactly the predicted cycles after the edge that takes ``start``, one
    clock period after ``start`` rises: predicted + 1 periods after it."""
    predicted = traced["report"]["total"]["predicted_cycles"]
    trace, period, taken = traced["trace"], traced["period"], traced["taken"]
    assert traced["trace"].timescale == "1ps" and period == 10_000       # 10 ns: 100 MHz
    assert taken == traced["start"] + period
    assert traced["done"] - taken == predicted * period
    assert trace.sampled(CYCLES, [taken, traced["done"] - period, traced["done"]]) == [
        0, predicted - 1, predicted]
    assert f"1 sample(s) on RTL: {predicted:,} cycles per sample (predicted {predicted:,})" \
        in traced["stdout"]
    assert traced["stdout"].endswith(f"Trace written to {traced['folder'] / 'run.vcd'}; view "
                                     f"it with: gtkwave {traced['folder'] / 'run.gtkw'}\n")
    assert traced["stderr"].startswith(f"Tracing 1 sample(s) of {predicted:,} predicted cycles "
                                       f"each into {traced['folder'] / 'run.vcd'} (a trace "
                                       f"grows with the cycles: trace a few samples) ...\n")


def save_file(path: Path) -> "tuple[dict[str, list[str]], list[str]]":
    """The groups of the GTKWave save file at ``path`` (name -> signals, in order) and its
    other lines (comments, settings, markers)."""
    groups, other, group, flags = {}, [], None, ""
    for line in path.read_text().splitlines():
        if line.startswith("@"):
            flags = line[1:]
        elif line.startswith("-") and flags == "800200":
            group = line[1:]
            groups[group] = []
        elif line.startswith("-") and flags == "1000200":
            assert line[1:] == group
            group = None
        elif line[0] in "[*^":
            other.append(line)
        else:
            assert group is not None, line
            groups[group].append(line)
    return groups, other


def gtkwave_names(trace) -> "dict[str, str]":
    """The names GTKWave gives the trace's signals (as listed by its ``gtkwave::getFacName``
    for a Verilator VCD: a reference holding a dot escaped with a backslash, the bit range
    appended) -> their scope."""
    return {f"{scope}.{chr(92) * ('.' in ref)}{ref}{bits}": scope
            for scope, ref, bits in trace.variables.values()}


#: The instance of each engine in the accelerator (hdl/top.py).
SCOPES = {"accelerator": ACCEL, "instruction fetch": ACCEL,
          "dispatcher": f"{ACCEL}.dispatcher", "program fetch": f"{ACCEL}.fetch",
          "tile walker": f"{ACCEL}.walker",
          "weight loader": f"{ACCEL}.loader", "feeder": f"{ACCEL}.feeder",
          "array": f"{ACCEL}.array", "post-processor": f"{ACCEL}.post",
          "element-wise engine": f"{ACCEL}.eltw", "harness": "hwonnx_harness"}


@pytest.mark.rtl
def test_save_file_groups_signals_of_the_trace_by_engine(traced):
    folder = traced["folder"]
    groups, other = save_file(folder / "run.gtkw")
    assert f'[dumpfile] "{(folder / "run.vcd").resolve()}"' in other
    assert list(groups) == list(SCOPES)         # no DMA engine
    names = gtkwave_names(traced["trace"])
    for group, signals in groups.items():
        assert len(signals) >= 1 and len(set(signals)) == len(signals), group
        for signal in signals:
            assert names.get(signal) == SCOPES[group], (group, signal)
    assert {START, DONE, f"{CYCLES}[31:0]"} <= set(
        groups["accelerator"])
    assert f"{ACCEL}.dispatcher.\\instr__payload.op[3:0]" in groups["dispatcher"]
    array = [s.split(".")[-1] for s in groups["array"]]
    assert [s for s in array if s.startswith("feed[")] == [f"feed[{i}][7:0]" for i in range(3)]
    assert [s for s in array if s.startswith("sums[")] == [f"sums[{j}][31:0]"
                                                          for j in range(5)]


@pytest.mark.rtl
def test_save_file_marks_the_start_and_each_layer(traced):
    """The primary marker at the edge that takes ``start`` (cycle 0); markers A and B at the
    first cycle of each layer's window in report.json; the opcodes of the dispatched
    instruction are shown by name (docs/architecture.md: 0 END, 2 MATMUL)."""
    groups, other = save_file(traced["folder"] / "run.gtkw")
    [markers] = [line for line in other if line.startswith("*")]
    times = [int(t) for t in markers.split()[1:]]
    windows = [layer["cycle_window"] for layer in traced["report"]["layers"]]
    assert len(windows) == 2
    assert times == [traced["taken"]] + [traced["taken"] + first * traced["period"]
                                         for first, _ in windows] + [-1] * 24
    [translate] = [line for line in other if line.startswith("^1 ")]
    table = dict(line.split(" ", 1) for line in Path(translate[3:]).read_text().splitlines())
    assert (table["0"], table["2"], table["a"]) == ("END", "MATMUL", "STOREA")
    for i, (first, end) in enumerate(windows):
        name = traced["report"]["layers"][i]["name"]
        assert f"[*] Marker {'AB'[i]}: layer '{name}', cycles {first} to {end - 1}" in other


@pytest.mark.rtl
def test_layer_windows_hold_their_layers_array_feeding(traced):
    """The report's windows follow one another from cycle 0 to the predicted total; in each,
    the feeder reads the activation buffer into the array (``act_en``) in exactly the cycles
    the report counts as the layer's compute, and in no cycle outside them. The dispatcher
    has issued every instruction when ``done`` rises."""
    report, trace = traced["report"], traced["trace"]
    windows = [tuple(layer["cycle_window"]) for layer in report["layers"]]
    total = report["total"]["predicted_cycles"]
    assert windows[0][0] == 0 and windows[-1][1] == total
    assert all(end == next_first for (_, end), (next_first, _) in zip(windows, windows[1:]))
    assert [end - first for first, end in windows] == [layer["predicted_cycles"]
                                                      for layer in report["layers"]]

    def fed(first, end):
        times = [traced["taken"] + cycle * traced["period"] for cycle in range(first, end)]
        return trace.sampled(FED, times).count(1)

    computes = [layer["cycle_breakdown"]["compute"] for layer in report["layers"]]
    assert all(computes)
    assert [fed(first, end) for first, end in windows] == computes
    assert fed(-100, total + 100) == sum(computes)
    assert trace.value_at(DISPATCHED, traced["done"]) == report["program"]["issued"]


@pytest.fixture(scope="module")
def fst_traced(build):
    """The same run traced into an FST file (its own traced build), or the reason it cannot
    be built here."""
    try:
        check_fst_toolchain()
    except ToolchainError as error:
        pytest.skip(str(error))
    folder, _ = build
    code, _, stderr = run("sim", folder / "build", "--input", folder / "x.npy", "--trace",
                          folder / "wave.fst")
    assert code == 0, stderr
    return folder / "wave.fst"


@pytest.mark.rtl
def test_fst_trace(traced, fst_traced):
    """The FST header block (type 0, 329 bytes) covers the same simulated time as the VCD of
    the same run; the save file lists the same signals, named as GTKWave names those of an
    FST dump: no backslash before a dotted name, no range on an integer (the harness's
    ``sample``)."""
    data = fst_traced.read_bytes()
    assert len(data) > 10_000
    assert data[0] == 0 and int.from_bytes(data[1:9], "big") == 329
    assert int.from_bytes(data[9:17], "big") == 0
    assert int.from_bytes(data[17:25], "big") == traced["trace"].end
    groups, other = save_file(fst_traced.with_suffix(".gtkw"))
    assert f'[dumpfile] "{fst_traced.resolve()}"' in other
    vcd = save_file(traced["folder"] / "run.gtkw")[0]
    assert groups == {group: [name.replace("\\", "").replace("sample[31:0]", "sample")
                              for name in names] for group, names in vcd.items()}


def gtkwave_facilities(dump: Path) -> "set[str]":
    """Every signal name GTKWave finds in ``dump`` (headless, under Xvfb, by Tcl)."""
    script = dump.with_name("facilities.tcl")
    script.write_text("for {set i 0} {$i < [gtkwave::getNumFacs]} {incr i} "
                      "{puts \"FAC [gtkwave::getFacName $i]\"}\ngtkwave::/File/Quit\n")
    shown = subprocess.run(["xvfb-run", "-a", "gtkwave", "-S", str(script), str(dump)],
                           capture_output=True, text=True, timeout=120).stdout
    return {line[4:] for line in shown.splitlines() if line.startswith("FAC ")}


@pytest.mark.rtl
@pytest.mark.skipif(not (shutil.which("gtkwave") and shutil.which("xvfb-run")),
                    reason="needs GTKWave and Xvfb (Debian: apt-get install gtkwave xvfb)")
@pytest.mark.parametrize("dump", ["run.vcd", "wave.fst"])
def test_gtkwave_finds_every_signal_of_the_save_file(traced, dump, request):
    """GTKWave itself reads each dump and knows every signal its save file names."""
    if dump.endswith(".fst"):
        request.getfixturevalue("fst_traced")
    path = traced["folder"] / dump
    facilities = gtkwave_facilities(path)
    assert len(facilities) > 1000
    signals = {s for names in save_file(path.with_suffix(".gtkw"))[0].values() for s in names}
    assert signals - facilities == set()


def test_every_engine_signal_exists_in_some_architecture():
    """Each signal the save file's groups name is declared by the Verilog of an accelerator
    without external memory (the wide fetch unit) or of one with an external memory, a
    narrow program memory and no tile walker (the DMA engine, the narrow fetch unit)."""
    plain = ArchConfig(rows=2, cols=3, act_depth=64, wgt_depth=32, acc_depth=8, par_depth=8,
                       prog_depth=16, lut_tables=0)
    other = ArchConfig(rows=2, cols=3, act_depth=64, wgt_depth=32, acc_depth=8, par_depth=8,
                       prog_depth=16, lut_tables=0, prog_width=32, walker=False,
                       eltwise=False, ext_memory="ulx3s-sdram", ext_depth=64)
    found = set()
    for config in (plain, other):
        sources = [accelerator_verilog(config, log=lambda message: None),
                   harness_verilog(config)]
        if config.ext_memory:
            sources.append(extmem_verilog(config))
        groups = dict(save_groups(declared_signals(*sources)))
        found |= {(group, re.sub(r"\[\d+\]$", "[*]", name))
                  for group, signals in groups.items() for _, name, _ in signals}
    wanted = {(group, name) for group, _, names in ENGINES for name in names}
    assert wanted - found == set()


@pytest.mark.parametrize("argv, message", [
    (["--trace", "run.txt"], "--trace writes a .vcd or .fst file (chosen by the suffix), not "
                             "'run.txt'"),
    (["--trace", "run.vcd", "--golden"], "--trace records the RTL simulation, and --golden "
                                         "runs none"),
    (["--trace", "missing/run.fst"], "Cannot write the trace to 'missing/run.fst': No such "
                                     "file or directory"),
    (["--trace", "."], "--trace writes a .vcd or .fst file (chosen by the suffix), not '.'"),
])
def test_trace_user_errors(tmp_path, monkeypatch, argv, message):
    """Refused in one line before the build folder is even read."""
    monkeypatch.chdir(tmp_path)
    assert run("sim", "no-build", "--input", "x.npy", *argv) == (
        2, "", f"hwonnx: error: {message}\n")


def test_fst_without_its_libraries(monkeypatch):
    monkeypatch.setattr("hwonnx.sim.trace.shutil.which", lambda name: "false")
    with pytest.raises(ToolchainError, match=re.escape(
            "An FST trace needs the LZ4 and zlib libraries, which Verilator's FST writer is "
            "compiled with: install them (Debian/Ubuntu: 'apt-get install liblz4-dev "
            "zlib1g-dev'), or trace to a .vcd file")):
        check_fst_toolchain()


def test_a_segmented_build_is_not_traced(tmp_path):
    """A segmented build runs several programs with host steps between them; --trace, which
    records one run, refuses it in one line (host_steps_helpers.segmented_build)."""
    _, result, x = segmented_build("softmax_middle", tmp_path)
    with pytest.raises(UsageError, match=re.escape(
            f"--trace records one program's run, and '{tmp_path / 'softmax_middle'}' is a "
            f"segmented build (2 programs with host steps between them)").join("^$")):
        simulate(result, x, trace=tmp_path / "run.vcd")
    assert not (tmp_path / "run.vcd").exists()
