"""The command line, in process: user errors are one line on stderr with exit status 2; build
and golden simulation of the bundled digits_mlp. (``sim`` without ``--golden`` runs Verilator
and is tested elsewhere.)"""

import contextlib
import io
import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, save
from spec_helpers import SUPPORTED

from cli_helpers import assert_only_error, run

from hwonnx.cli import build_parser, main
from hwonnx.demo import evaluate_example
from hwonnx.errors import UsageError
from hwonnx.examples import example_path

MLP = str(example_path("digits_mlp"))


@pytest.fixture(scope="module")
def mlp_build(digits, tmp_path_factory):
    """``hwonnx build digits_mlp --calib calib.npy`` once for the module (writes Verilog)."""
    folder = tmp_path_factory.mktemp("cli")
    np.save(folder / "calib.npy", digits["calib"])
    out = folder / "build"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["build", MLP, "-o", str(out), "--calib", str(folder / "calib.npy")])
    return folder, out, code, stdout.getvalue(), stderr.getvalue()


def test_build(mlp_build):
    _, out, code, stdout, stderr = mlp_build
    assert code == 0
    assert stdout == ""                                  # progress goes to stderr
    lines = stderr.splitlines()
    assert re.fullmatch(r"Compiled 2 layer\(s\), \d+ instructions, 2,368 MACs in \d+\.\d s",
                        lines[0])
    assert lines[-1].startswith(f"Build written to {out}/ (report.md: ")
    for name in ("accel.v", "arch.json", "program.json", "prog.hex", "wgt.hex", "par.hex",
                 "graph.json", "graph.npz", "report.json", "report.md"):
        assert (out / name).is_file(), name


def test_sim_golden_writes_outputs(mlp_build, digits, capsys):
    folder, out, code, _, _ = mlp_build
    assert code == 0
    images, labels = digits["test_images"], digits["test_labels"]
    np.save(folder / "x.npy", images)
    code, stdout, stderr = run(capsys, "sim", out, "--input", folder / "x.npy", "--golden",
                               "--output", folder / "y.npz")
    assert code == 0 and stderr == ""
    assert re.fullmatch(rf"{len(images)} sample\(s\) on the golden model \(predicted [\d,]+ "
                        rf"cycles per sample\)\nOutputs written to {re.escape(str(folder))}"
                        rf"/y\.npz\n", stdout)
    with np.load(folder / "y.npz") as npz:
        assert npz.files == ["logits"]
        logits = npz["logits"]
    assert logits.dtype == np.float32 and logits.shape == (len(images), 10)
    assert (logits.argmax(axis=1) == labels).mean() >= 0.9


def test_sim_golden_without_output_file(mlp_build, digits, capsys):
    folder, out, _, _, _ = mlp_build
    np.savez(folder / "few.npz", image=digits["test_images"][:3].reshape(3, 1, 64))
    code, stdout, stderr = run(capsys, "sim", out, "--input", folder / "few.npz", "--golden")
    assert code == 0 and stderr == ""
    assert re.fullmatch(r"3 sample\(s\) on the golden model \(predicted [\d,]+ cycles per "
                        r"sample\)\n", stdout)


def test_sim_missing_input(mlp_build, capsys):
    folder, out, _, _, _ = mlp_build
    missing = folder / "missing.npy"
    assert_only_error(run(capsys, "sim", out, "--input", missing, "--golden"),
                      re.escape(f"Input file '{missing}' does not exist"))


def test_sim_input_of_the_wrong_shape(mlp_build, capsys):
    folder, out, _, _, _ = mlp_build
    np.save(folder / "bad.npy", np.zeros((4, 8, 8), np.float32))
    assert_only_error(run(capsys, "sim", out, "--input", folder / "bad.npy", "--golden"),
                      re.escape(f"Input file '{folder / 'bad.npy'}': array 'image' has shape "
                                f"(4, 8, 8), but samples of input 'image' (1, 64) need shape "
                                f"(S, 1, 64) or (S, 64)"))


def test_sim_not_a_build_folder(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((1, 64), np.float32))
    assert_only_error(run(capsys, "sim", tmp_path, "--input", tmp_path / "x.npy", "--golden"),
                      re.escape(f"'{tmp_path}' is not an hwonnx build folder (no "
                                f"program.json); run 'hwonnx build MODEL -o {tmp_path}' "
                                f"first"))


def test_build_without_calib(tmp_path, capsys):
    assert_only_error(run(capsys, "build", MLP, "-o", tmp_path / "out"), re.escape(
        "Calibration data is required to quantize a float model: pass --calib samples.npz "
        "(one array per input, first axis = samples) or an .npy for a single-input model"))
    assert not (tmp_path / "out").exists()


def test_build_missing_model(tmp_path, capsys):
    model = tmp_path / "nowhere" / "model.onnx"
    assert_only_error(run(capsys, "build", model, "-o", tmp_path / "out"),
                      re.escape(f"Cannot read model '{model}': No such file or directory"))


def test_build_unsupported_operators(tmp_path, capsys):
    nodes = [helper.make_node("Gemm", ["x", "w"], ["h"], name="fc"),
             helper.make_node("Sin", ["h"], ["s"], name="act"),
             helper.make_node("Expand", ["s", "index"], ["p"], name="probs"),
             helper.make_node("Gemm", ["p", "w2"], ["y"], name="fc2")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(np.ones((4, 3), np.float32), "w"),
         numpy_helper.from_array(np.ones((3, 2), np.float32), "w2"),
         numpy_helper.from_array(np.array([1, 3], np.int64), "index")])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    save(model, tmp_path / "m.onnx")
    np.save(tmp_path / "calib.npy", np.zeros((3, 4), np.float32))
    assert_only_error(
        run(capsys, "build", tmp_path / "m.onnx", "-o", tmp_path / "out", "--calib",
            tmp_path / "calib.npy"),
        re.escape(f"2 unsupported node(s): node 'act' Sin (domain 'ai.onnx', opset 17); "
                  f"node 'probs' Expand (domain 'ai.onnx', opset 17) (Expand 'probs' is folded "
                  f"away, so its inputs must be constants, but 's' is computed at run time); "
                  f"{SUPPORTED}"))


def test_build_calib_of_the_wrong_shape(tmp_path, capsys, digits):
    np.save(tmp_path / "calib.npy", digits["calib"].reshape(-1, 8, 8))
    assert_only_error(
        run(capsys, "build", MLP, "-o", tmp_path / "out", "--calib", tmp_path / "calib.npy"),
        re.escape(f"Calibration file '{tmp_path / 'calib.npy'}': array 'image' has shape "
                  f"(200, 8, 8), but samples of input 'image' (1, 64) need shape (S, 1, 64) "
                  f"or (S, 64)"))


def test_build_invalid_architecture(tmp_path, capsys):
    assert_only_error(run(capsys, "build", MLP, "-o", tmp_path / "out", "--rows", "0"),
                      re.escape("Invalid architecture: ArchConfig.rows must be a positive "
                                "integer, not 0"))


def test_resource_error_advice_can_be_followed(tmp_path, capsys, digits):
    """The program (three instructions per layer) does not fit a 4-word program buffer
    given by hand; the error names an option of ``hwonnx build`` that fixes it."""
    np.save(tmp_path / "calib.npy", digits["calib"])
    argv = ["build", MLP, "-o", tmp_path / "out", "--calib", tmp_path / "calib.npy",
            "--rows", "1", "--cols", "1"]
    code, out, err = run(capsys, *argv, "--prog-depth", "4")
    assert_only_error((code, out, err), r"The model needs \d+ words of the prog buffer, but the "
                                      r"1x1 architecture has 4; raise --prog-depth or use a "
                                      r"larger board")
    needed = int(re.search(r"needs (\d+) words", err).group(1))
    assert needed > 4
    args = build_parser().parse_args([str(a) for a in argv] + ["--prog-depth", str(needed)])
    assert args.prog_depth == needed
    from hwonnx import api
    result = api.build(MLP, None, calib={"image": digits["calib"]}, rows=1, cols=1,
                       prog_depth=needed, log=lambda _: None)
    assert result.program.words["prog"] == needed


@pytest.mark.parametrize("value", ["-3", "2.5", "all"])
def test_demo_refuses_a_sample_count_that_is_not_a_whole_number_from_0(tmp_path, capsys,
                                                                         value):
    """Regression: ``--samples -3`` ran the demo on all but the last 3 test images."""
    with pytest.raises(SystemExit) as stop:
        main(["demo", f"--samples={value}", "-o", str(tmp_path / "demo")])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"hwonnx demo: error: argument --samples: expected a whole number from 0, not "
        f"'{value}'")
    assert not (tmp_path / "demo").exists()
    with pytest.raises(UsageError, match=r"^The number of test samples \(--samples\) must be "
                                         r"a whole number from 0 \(0: all\), not -3$"):
        evaluate_example("digits_mlp", tmp_path / "demo", samples=-3)


def test_boards(capsys):
    code, out, err = run(capsys, "boards")
    assert code == 0 and err == ""
    assert "sim" in [line.split()[0] for line in out.splitlines()]
    assert re.search(r"^sim +\d+x\d+ +\d+MHz ", out, re.MULTILINE)
    assert re.search(r"^ulx3s-85f +8x8 +25MHz +156 +3744 +83640 +YoWASP", out, re.MULTILINE)


# Regressions: user errors that once escaped as tracebacks or misread input ----------------

def test_sim_output_reports_the_file_it_writes(mlp_build, digits, capsys):
    """``--output y.out`` makes ``np.savez`` write ``y.out.npz``, yet the CLI reports
    ``y.out``: the reported path must be the file that holds the outputs."""
    folder, out, _, _, _ = mlp_build
    np.save(folder / "x3.npy", digits["test_images"][:3])
    code, stdout, stderr = run(capsys, "sim", out, "--input", folder / "x3.npy", "--golden",
                               "--output", folder / "y.out")
    assert code == 0 and stderr == ""
    written = re.search(r"^Outputs written to (.+)$", stdout, re.MULTILINE).group(1)
    with np.load(written) as npz:
        assert npz.files == ["logits"] and npz["logits"].shape == (3, 10)


def test_sim_output_into_a_missing_folder_is_a_user_error(mlp_build, digits, capsys):
    """A user-caused failure to write ``--output`` escapes as a FileNotFoundError traceback
    (exit status 1) instead of one ``hwonnx: error:`` line with status 2."""
    folder, out, _, _, _ = mlp_build
    np.save(folder / "x3.npy", digits["test_images"][:3])
    target = folder / "no_such_folder" / "y.npz"
    code, stdout, stderr = run(capsys, "sim", out, "--input", folder / "x3.npy", "--golden",
                               "--output", target)
    assert code == 2
    assert re.fullmatch(r"hwonnx: error: .*" + re.escape(str(target)) + r".*\n", stderr)


def test_build_out_is_an_existing_file(tmp_path, capsys, digits):
    """``-o`` naming an existing file escapes as a FileExistsError traceback from
    ``Path.mkdir`` instead of one ``hwonnx: error:`` line with status 2."""
    np.save(tmp_path / "calib.npy", digits["calib"])
    target = tmp_path / "taken"
    target.write_text("not a folder")
    code, stdout, stderr = run(capsys, "build", MLP, "-o", target, "--calib",
                               tmp_path / "calib.npy")
    assert code == 2
    assert re.fullmatch(r"(?s).*^hwonnx: error: .*" + re.escape(str(target)) + r".*\n",
                        stderr, re.MULTILINE)


@pytest.mark.parametrize("args, message", [
    (["--board", "ulx3s-85f", "--baud", "3000000"],
     "A UART of 3000000 baud cannot run from the 25 MHz clock: it divides the clock by a "
     "whole number of at least 4, within 2% (near it: 2777778 or 3125000 baud)"),
    (["--board", "ulx3s-85f", "--baud", "0"],
     "A UART of 0 baud cannot run from the 25 MHz clock: it divides the clock by a whole "
     "number of at least 4, within 2% (near it: 5000000 or 6250000 baud)"),
    (["--baud", "115200"], "--baud sets a board's UART: it needs --board")])
def test_build_refuses_a_baud_rate_the_board_cannot_make(tmp_path, capsys, args, message):
    code = main(["build", "digits_mlp", "-o", str(tmp_path / "out"), *args])
    captured = capsys.readouterr()
    assert code == 2 and captured.err == f"hwonnx: error: {message}\n"
    assert not (tmp_path / "out").exists()


def test_build_sets_the_board_uart_rate(tmp_path):
    """The bitstream's UART divides the 25 MHz clock by 25 for 1 Mbaud, and the board
    description tells hwonnx run to open the port at that rate."""
    import json

    from hwonnx.boards.top import uart_divisor

    assert main(["build", "digits_mlp", "-o", str(tmp_path / "out"), "--board", "ulx3s-85f",
                 "--baud", "1000000"]) == 0
    info = json.loads((tmp_path / "out" / "board" / "hwonnx_board.json").read_text())
    assert info["baud"] == 1_000_000
    assert uart_divisor(25_000_000, 1_000_000) == 25
    assert uart_divisor(25_000_000, 115_200) == 217          # 0.01% off


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """``hwonnx inspect model.onnx | head``: the pipe closes before hwonnx writes; it stops
    without a traceback (exit 141, as a shell reports SIGPIPE)."""
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "hwonnx.cli", "inspect", "digits_cnn"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()                  # before the interpreter has even started
    _, err = process.communicate(timeout=120)
    assert process.returncode == 141, err
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err
