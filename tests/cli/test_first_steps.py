"""What a newcomer meets first: the bundled examples load without a warning, ``hwonnx
inspect`` says each warning once, takes the bundled names and checks its options as ``build``
does, the commands show progress on stderr without the tools' chatter, an empty model file is
named as such, ``simulate`` takes one array for a one-input model, ``hwonnx boards`` is a
table whose columns line up, and the README says what the quick start needs."""

import io
import logging
import re
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hwonnx import api
from hwonnx.boards import BOARDS
from hwonnx.cli import main
from hwonnx.cli_output import Output
from hwonnx.demo import ExampleRun, format_demo
from hwonnx.errors import ModelError, UsageError
from hwonnx.examples import EXAMPLES, example_path, load_digits_data
from hwonnx.examples.train_digits import clean_names
from hwonnx.frontend import load_model

from helpers import raises

ROOT = Path(__file__).resolve().parents[2]
MLP = str(example_path("digits_mlp"))
NAMES_WARNING = ("5 name(s) do not follow C identifier syntax, e.g. 'fc1.weight', 'fc1.bias', "
                 "'/fc1/Gemm_output_0', ...; accepted as they are (ONNX IR: all names MUST "
                 "adhere to C identifier syntax)")


# 1. The bundled examples follow the ONNX naming rules --------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_bundled_example_loads_without_any_warning(name, caplog):
    caplog.set_level(logging.DEBUG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = load_model(example_path(name))
    assert caught == []
    assert graph.meta["warnings"] == ()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert graph.inputs == ("image",) and graph.outputs == ("logits",)


def torch_named_model() -> onnx.ModelProto:
    """A model named the way the PyTorch exporter names the bundled examples."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gemm", ["image", "fc1.weight", "fc1.bias"],
                              ["/fc1/Gemm_output_0"], name="/fc1/Gemm", transB=1),
             helper.make_node("Relu", ["/fc1/Gemm_output_0"], ["logits"], name="/relu1/Relu")]
    graph = helper.make_graph(
        nodes, "main_graph", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(rng.normal(size=(3, 4)).astype(np.float32), "fc1.weight"),
         numpy_helper.from_array(rng.normal(size=3).astype(np.float32), "fc1.bias")])
    return helper.make_model(graph, ir_version=7, opset_imports=[helper.make_opsetid("", 13)])


def test_training_script_gives_c_identifier_names():
    """``train_digits.py`` renames what the exporter writes; only the names change."""
    model = torch_named_model()
    clean = clean_names(onnx.load_from_string(model.SerializeToString()))
    assert [i.name for i in clean.graph.initializer] == ["fc1_weight", "fc1_bias"]
    assert [(n.name, list(n.input), list(n.output)) for n in clean.graph.node] == [
        ("fc1_Gemm", ["image", "fc1_weight", "fc1_bias"], ["fc1_Gemm_output_0"]),
        ("relu1_Relu", ["fc1_Gemm_output_0"], ["logits"])]
    for before, after in zip(model.graph.initializer, clean.graph.initializer):
        assert after.raw_data == before.raw_data and after.dims == before.dims
    assert load_model(clean).meta["warnings"] == ()
    assert load_model(model).meta["warnings"] == (NAMES_WARNING,)


# 2. ``hwonnx inspect`` says a warning once ---------------------------------------------------

def test_inspect_says_a_warning_once(tmp_path, capsys, caplog):
    onnx.save(torch_named_model(), tmp_path / "m.onnx")
    assert main(["inspect", str(tmp_path / "m.onnx")]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert f"Warnings:\n  - {NAMES_WARNING}\n" in out
    assert (out + err).count("do not follow C identifier syntax") == 1
    assert [r.getMessage() for r in caplog.records] == []       # nor logged besides


def test_inspect_of_a_model_it_cannot_load_still_logs_the_warnings(tmp_path, capsys, caplog):
    model = torch_named_model()
    model.graph.node[1].op_type = "Sin"
    onnx.save(model, tmp_path / "m.onnx")
    assert main(["inspect", str(tmp_path / "m.onnx")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("hwonnx: error: 1 unsupported node(s): node "
                                        "'/relu1/Relu' Sin ")
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("hwonnx.frontend", NAMES_WARNING)]


# 3. Progress on stderr, without the tools' chatter unless -v ---------------------------------

def fake_bitstream_cli(*argv: str) -> "subprocess.CompletedProcess[str]":
    """``hwonnx *argv`` in a fresh process (logging as the CLI sets it up, not as pytest
    does), with ``api.bitstream`` replaced by a step that logs like cocotb's runner."""
    code = ("import logging, sys\n"
            "from hwonnx import api, cli\n"
            "def bitstream(out, log):\n"
            "    logging.getLogger('Verilator').setLevel(logging.INFO)\n"
            "    logging.getLogger('Verilator').info('Running command %s', 'make')\n"
            "    log('Building the bitstream ...')\n"
            "    logging.getLogger('hwonnx.frontend').warning('a warning')\n"
            "    log('Bitstream built')\n"
            "api.bitstream = bitstream\n"
            "sys.exit(cli.main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120)


def test_tool_chatter_shows_only_with_verbose():
    quiet = fake_bitstream_cli("bitstream", "out")
    assert (quiet.returncode, quiet.stdout) == (0, "")
    assert quiet.stderr == ("Building the bitstream ...\nhwonnx.frontend: a warning\n"
                            "Bitstream built\n")
    verbose = fake_bitstream_cli("-v", "bitstream", "out")
    assert (verbose.returncode, verbose.stdout) == (0, "")
    assert verbose.stderr == ("Verilator: Running command make\nBuilding the bitstream ...\n"
                              "hwonnx.frontend: a warning\nBitstream built\n")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_shows_each_step(monkeypatch):
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm")
    terminal, stdout = Terminal(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(sys, "stdout", stdout)
    output = Output()
    with output.steps("Reading and compiling m.onnx ..."):
        output.log("Compiled 2 layer(s), 87 instructions, 2,368 MACs in 0.0 s")
        output.log("Wrote Verilog for the 8x8 array in 7.1 s")         # shown under: Generating
        output.log("Simulating 5 test images of m on the RTL ...")
        output.log("Built in 42 s: /cache/rtl/8x8")                    # shown under: Simulating
        output.log("done")
    text = terminal.getvalue()
    assert stdout.getvalue() == ""
    for line in ("Compiled 2 layer(s), 87 instructions, 2,368 MACs in 0.0 s",
                 "Wrote Verilog for the 8x8 array in 7.1 s",
                 "Simulating 5 test images of m on the RTL ...", "Built in 42 s: /cache/rtl/8x8",
                 "done"):
        assert f"{line}\n" in text
    shown = re.findall(r"\S (Reading and compiling m\.onnx \.\.\.|Generating Verilog \.\.\.|"
                       r"Simulating(?: 5 test images of m)? on the RTL \.\.\.) .*?\d:\d\d:\d\d",
                       text)
    assert list(dict.fromkeys(shown)) == [
        "Reading and compiling m.onnx ...", "Generating Verilog ...",
        "Simulating 5 test images of m on the RTL ...", "Simulating on the RTL ..."]


def test_progress_elsewhere_is_the_lines_alone(capsys):
    output = Output()
    with output.steps("Reading and compiling m.onnx ..."):
        output.log("Compiled 2 layer(s)")
        output.log("Simulating on the RTL ...")
    assert capsys.readouterr() == ("", "Compiled 2 layer(s)\nSimulating on the RTL ...\n")


def test_demo_results_say_where_the_builds_are():
    run = ExampleRun("digits_mlp", 450, {"float (onnxruntime)": 0.97, "int8 golden": 0.96,
                                         "int8 RTL": 0.96}, 0.99, True, 410, 410, 0.09, 1e6,
                     "8x8", Path("hwonnx-demo/digits_mlp"))
    assert format_demo([run]).splitlines()[-1] == (
        "Builds (accel.v, program and memory images, report.md) in hwonnx-demo/digits_mlp/")


def test_demo_folder_is_ignored_by_git():
    assert "hwonnx-demo/" in (ROOT / ".gitignore").read_text().splitlines()


# 4. ``hwonnx inspect`` takes the names of the bundled examples, as ``build`` does -------------

def test_inspect_bundled_example_by_name(capsys):
    assert main(["inspect", "digits_mlp"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.startswith("Model: digits_mlp.onnx\n  IR version:    7\n")
    assert "\nPlacement on a 8x8 array (2,368 MACs, " in out


def test_a_file_of_that_name_comes_first(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "digits_mlp").write_bytes(b"")
    assert main(["inspect", "digits_mlp"]) == 2
    assert capsys.readouterr() == ("", "hwonnx: error: Model file 'digits_mlp' is empty\n")


# 5. An empty model file ------------------------------------------------------------------------

def test_empty_model_file_is_named_as_such(tmp_path, capsys):
    path = tmp_path / "x.onnx"
    path.write_bytes(b"")
    with raises(ModelError, f"Model file '{path}' is empty"):
        load_model(path)
    with raises(ModelError, "The model bytes are empty"):
        load_model(b"")
    assert main(["inspect", str(path)]) == 2
    assert capsys.readouterr() == ("", f"hwonnx: error: Model file '{path}' is empty\n")


# 6. ``simulate`` takes one array; ``inspect`` checks the architecture as ``build`` does --------

@pytest.fixture(scope="module")
def mlp_result():
    calib = {"image": load_digits_data()["calib"]}
    return api.build(MLP, None, calib=calib, verilog=False, log=lambda message: None)


def test_simulate_takes_one_array_for_a_single_input_model(mlp_result):
    images = load_digits_data()["test_images"][:5]
    by_array = api.simulate(mlp_result, images, mode="golden")
    by_name = api.simulate(mlp_result, {"image": images}, mode="golden")
    assert by_array.outputs.keys() == {"logits"}
    assert np.array_equal(by_array.outputs["logits"], by_name.outputs["logits"])
    assert np.array_equal(by_array.int_outputs, by_name.int_outputs)


def test_simulate_refuses_one_array_for_two_inputs_and_other_types(mlp_result):
    graph = mlp_result.graph
    two = replace(mlp_result, graph=replace(graph, inputs=("image", "mask"), types={
        **graph.types, "mask": graph.types["image"]}))
    images = load_digits_data()["test_images"][:2]
    with raises(UsageError, "Input data is one array, but the model has 2 inputs ('image', "
                "'mask'); pass a dict of arrays keyed by input name"):
        api.simulate(two, images, mode="golden")
    with raises(UsageError, "Input data must be a dict of arrays keyed by input name, one "
                "NumPy array (single-input model) or a sample file path, not list"):
        api.simulate(mlp_result, images.tolist(), mode="golden")


@pytest.mark.parametrize("command", ["inspect", "build"])
def test_inspect_and_build_refuse_an_invalid_array_alike(command, tmp_path, capsys):
    out = [] if command == "inspect" else ["-o", str(tmp_path / "out")]
    assert main([command, MLP, "--rows", "100", *out]) == 2
    assert capsys.readouterr() == ("", "hwonnx: error: Invalid architecture: ArchConfig array "
                                       "must be at most 64x64, not 100x8\n")


@pytest.mark.parametrize("lanes, why", [
    ("3", "ArchConfig.post_lanes must be 0 or a divisor of cols (8), not 3"),
    ("-2", "ArchConfig.post_lanes must be 0 or a divisor of cols (8), not -2")])
def test_build_refuses_post_lanes_that_do_not_divide_the_columns(lanes, why, tmp_path, capsys):
    assert main(["build", MLP, "--post-lanes", lanes, "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr() == ("", f"hwonnx: error: Invalid architecture: {why}\n")
    assert not (tmp_path / "out").exists()


# 7. ``hwonnx boards``: columns that line up; every board and subpackage in the README ------

def test_boards_columns_line_up(capsys):
    assert main(["boards"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    header, *rows = out.splitlines()
    assert len(rows) == len(BOARDS)
    starts = {word: header.index(word) for word in ("board", "bitstream", "description")}
    ends = {word: header.index(word) + len(word) for word in ("array", "clock", "DSP",
                                                              "BRAM kb", "LUTs")}
    for row, board in zip(rows, BOARDS.values()):
        cfg = board.default_config
        assert row.index(board.name) == starts["board"]
        assert row.index(board.description) == starts["description"]
        assert row[starts["bitstream"] - 2:starts["bitstream"]] == "  "
        for word, cell in (("array", f"{cfg.rows}x{cfg.cols}"), ("DSP", f"{board.dsp}"),
                           ("clock", f"{board.clock_hz / 1e6:.0f}MHz"),
                           ("BRAM kb", f"{board.bram_kbits}"), ("LUTs", f"{board.luts}")):
            assert row[ends[word] - len(cell) - 1:ends[word]] == f" {cell}", (row, word)
    assert rows[-1].startswith("de10-nano")
    assert " ".join(rows[-1].split()).endswith("Quartus Terasic DE10-Nano, Intel Cyclone V "
                                               "5CSEBA6")
    gowin = rows[list(BOARDS).index("tang-primer-20k")]
    assert gowin.startswith("tang-primer-20k") and "YoWASP (PyPI)  Sipeed Tang Primer 20K" in gowin


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_readme_boards_section_names_every_board():
    mentioned = {"icebreaker": "iCEBreaker", "ulx3s-85f": "ULX3S", "ecpix5-85": "ECPIX-5",
                 "arty-a7-35": "Arty A7", "arty-a7-100": "Arty A7", "de10-nano": "DE10-Nano",
                 "tang-primer-20k": "Tang Primer 20K", "icesugar": "iCESugar",
                 "upduino-v3": "UPduino v3", "orangecrab-85f": "OrangeCrab",
                 "ulx3s-25f": "ULX3S", "orangecrab-25f": "OrangeCrab",
                 "colorlight-5a-75b": "Colorlight 5A-75B", "icesugar-pro": "iCESugar-Pro",
                 "tang-nano-9k": "Tang Nano 9K", "arty-z7-20": "Arty Z7",
                 "ebaz4205": "EBAZ4205"}
    assert set(mentioned) == {name for name, b in BOARDS.items() if not b.is_simulation}
    section = " ".join(readme_section("Boards").split())
    assert [name for name, text in mentioned.items() if text not in section] == []


def test_readme_layout_names_every_subpackage():
    section = readme_section("Layout")
    packages = sorted(p.parent.name for p in (ROOT / "hwonnx").glob("*/__init__.py"))
    assert len(packages) >= 9
    for folder in [*packages, "hdl", "sim", "boards", "tests", "bench", "docs"]:
        assert f"`{folder}/`" in section, folder


# 8. The quick start says what Verilator needs ---------------------------------------------------

def test_readme_quick_start_names_the_compiler_verilator_needs():
    section = readme_section("Quick start")
    assert "\npip install -e . && hwonnx demo\n" in section
    assert '\npip install -e ".[test]" && ruff check && pytest\n' in section
    # .ci/run runs the first line that starts so: the lint, then the tests
    first = next(line for line in (ROOT / "README.md").read_text().splitlines()
                 if re.match(r'^pip install -e "\.\[test\]"', line))
    assert first == 'pip install -e ".[test]" && ruff check && pytest'
    assert "`g++` and `make`" in " ".join(section.split())
