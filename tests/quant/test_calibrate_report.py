"""What a user sees of the calibration method: the build's warning when the int8 model departs
from the float one (naming the layer where the error grows), the report's method, and
``hwonnx inspect --calib``'s comparison and suggestion. The expected errors come from
onnxruntime's entropy range and a NumPy computation of the float model."""

import contextlib
import io
import json
import re

import numpy as np
import pytest
from onnx import helper, numpy_helper, save
from onnxruntime.quantization.calibrate import HistogramCollector

from hwonnx.cli import main
from hwonnx.errors import UsageError
from hwonnx.explore import explore
from hwonnx.explore.outputs import _build_command
from hwonnx.explore.point import run_task
from hwonnx.explore.sweep import prepare

from helpers import raises

SAMPLES = np.random.default_rng(0).uniform(-1, 1, (64, 1, 16)).astype(np.float32)


def sparse_model():
    """y = 4 * Relu(x - 0.95) on 16 features (two Gemm): for x uniform in [-1, 1] the hidden
    value is 0 on 97.5 % of its entries, which the entropy method clips to a small part of its
    range."""
    eye = np.eye(16, dtype=np.float32)
    inits = [numpy_helper.from_array(eye, "fc1.weight"),
             numpy_helper.from_array(np.full(16, -0.95, np.float32), "fc1.bias"),
             numpy_helper.from_array(4 * eye, "fc2.weight"),
             numpy_helper.from_array(np.zeros(16, np.float32), "fc2.bias")]
    nodes = [helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["/fc1/Gemm_output_0"],
                              name="/fc1/Gemm"),
             helper.make_node("Relu", ["/fc1/Gemm_output_0"], ["/relu/Relu_output_0"],
                              name="/relu/Relu"),
             helper.make_node("Gemm", ["/relu/Relu_output_0", "fc2.weight", "fc2.bias"], ["y"],
                              name="/fc2/Gemm")]
    graph = helper.make_graph(nodes, "main_graph",
                              [helper.make_tensor_value_info("x", 1, [1, 16])],
                              [helper.make_tensor_value_info("y", 1, [1, 16])], inits)
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def expected_entropy_error() -> float:
    """The output error of the entropy method, from onnxruntime's entropy range of the hidden
    value (its collector on NumPy's float model), the output clipped where the hidden value
    is: RMS of the difference as a share of the output's range."""
    hidden = np.maximum(SAMPLES + np.float32(-0.95), 0)
    collector = HistogramCollector("entropy", False, 2048, 128, 99.999, "same")
    with contextlib.redirect_stdout(io.StringIO()):
        collector.collect({"h": list(hidden)})
        top = float(collector.compute_collection_result()["h"][1])
    y = 4 * hidden.astype(np.float64)
    clipped = 4 * np.minimum(hidden, top)
    return float(np.sqrt(np.mean((clipped - y) ** 2)) / np.ptp(y))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sparse")
    save(sparse_model(), folder / "model.onnx")
    np.save(folder / "calib.npy", SAMPLES)
    return folder


def _run(capsys, caplog, *argv):
    """``hwonnx *argv`` in process: its stdout, and the lines it logs to the console (under
    pytest, logging's handler is pytest's: the records)."""
    caplog.clear()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, "\n".join(record.getMessage() for record in caplog.records)


def test_build_warns_naming_the_layer_where_the_error_grows(files, capsys, caplog):
    """With --calibrate entropy the output departs by about 8 % of its range: one console
    warning names the output, the error (within half a point of onnxruntime's range applied
    in NumPy: the int8 rounding adds to the clipping) and the first Gemm, whose output the
    range clips; the report says the method. minmax: no such warning (0.8 %)."""
    expected = expected_entropy_error()
    assert expected > 0.05
    _, err = _run(capsys, caplog, "build", files / "model.onnx", "-o", files / "entropy",
                  "--calib",
                  files / "calib.npy", "--calibrate", "entropy")
    warnings = re.findall(r"The int8 model's output 'y' departs from the float model's by "
                          r"([\d.]+)% of its range \(RMS on the calibration data\); the error "
                          r"grows most at layer '(.+?)' \(from ([\d.]+)% of the range at its "
                          r"input to ([\d.]+)% at its output\)", err)
    assert len(warnings) == 1, err
    error, layer, before, after = warnings[0]
    assert float(error) == pytest.approx(100 * expected, abs=0.5)
    assert layer == "/fc1/Gemm"
    assert float(before) < 1 < float(after)
    report = json.loads((files / "entropy" / "report.json").read_text())
    assert report["quantization"]["calibration"].startswith("entropy (KL divergence")

    _, err = _run(capsys, caplog, "build", files / "model.onnx", "-o", files / "minmax",
                  "--calib",
                  files / "calib.npy")
    assert "departs from the float model" not in err
    report = json.loads((files / "minmax" / "report.json").read_text())
    assert report["quantization"]["calibration"] == "min-max"


def test_inspect_compares_the_methods_and_suggests_one(files, capsys, caplog):
    """``hwonnx inspect --calib`` prints each method's output error and suggests the method
    with the smallest: entropy's is onnxruntime's range applied in NumPy (within half a point),
    and it is not suggested."""
    out, _ = _run(capsys, caplog, "inspect", files / "model.onnx", "--calib", files / "calib.npy")
    rows = dict(re.findall(r"^\| (minmax|percentile|entropy|mse) \| ([\d.]+)% \|$", out, re.M))
    assert list(rows) == ["minmax", "percentile", "entropy", "mse"]
    assert float(rows["entropy"]) == pytest.approx(100 * expected_entropy_error(), abs=0.5)
    suggested = re.search(r"^Suggested: --calibrate (\w+) \(its largest output error, "
                          r"([\d.]+)%, is the smallest\)$", out, re.M)
    assert suggested, out
    assert suggested.group(1) != "entropy"
    assert float(suggested.group(2)) == min(float(v) for v in rows.values())
    assert float(suggested.group(2)) < 1.0


def test_explore_takes_the_method_to_every_point(files, tmp_path):
    """``hwonnx explore --calibrate``: refused by name before anything runs; otherwise part of
    the payload's digest (min/max keeps the digest it had) and of each point's build (a point
    given an unknown method in its payload fails with the build's refusal) and of the
    suggested build command."""
    model, calib = files / "model.onnx", {"x": SAMPLES}
    with raises(UsageError, "Calibration method must be one of minmax, percentile, entropy, "
                            "mse, not 'kl'"):
        explore(model, "sim", rows=(4,), cols=(4,), calib=calib, out_dir=tmp_path / "x",
                calibrate="kl")
    assert not (tmp_path / "x").exists()
    plain, entropy = prepare(model, calib=calib), prepare(model, calib=calib,
                                                          calibrate="entropy")
    assert entropy["calibrate"] == "entropy" and plain["calibrate"] == "minmax"
    assert plain["inputs_digest"] != entropy["inputs_digest"]
    record = run_task({"board": "sim", "rows": 4, "cols": 4, "depths": {}, "bitstream": False,
                       "sim": 0}, "4x4-test", {**entropy, "calibrate": "kl"}, 120)
    assert record["status"] == "failed", record
    assert record["reason"] == ("UsageError: Calibration method must be one of minmax, "
                                "percentile, entropy, mse, not 'kl'"), record["reason"]
    summary = {"board": "sim", "model": "m.onnx", "calib": "c.npz", "bitstream": False,
               "calibrate": "entropy"}
    assert _build_command(summary, {"rows": 4, "cols": 4, "array": "4x4"}) == (
        "hwonnx build m.onnx --board sim --rows 4 --cols 4 --calib c.npz --calibrate entropy "
        "-o build-4x4/")


def test_inspect_refuses_missing_calibration_data(files, tmp_path, capsys):
    """Refused in one line before anything is printed."""
    missing = tmp_path / "missing.npz"
    code = main(["inspect", str(files / "model.onnx"), "--calib", str(missing)])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err == f"hwonnx: error: Calibration file '{missing}' does not exist\n"
