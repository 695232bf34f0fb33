"""The Python API end to end on the bundled digits_cnn, golden model only (no Verilator)."""

import json
import re

import numpy as np
import onnx
import pytest

from hwonnx import api
from hwonnx.compiler import Op, decode, instruction_width
from hwonnx.config import PRESETS, ArchConfig
from hwonnx.errors import ModelError, QuantizationError
from hwonnx.examples import example_path

FILES = ("arch.json", "program.json", "prog.hex", "wgt.hex", "par.hex", "graph.json",
         "graph.npz", "report.json", "report.md")


@pytest.fixture(scope="module")
def built(digits, tmp_path_factory):
    out = tmp_path_factory.mktemp("cnn") / "out"
    messages = []
    result = api.build(example_path("digits_cnn"), out,
                       calib={"image": digits["calib"].reshape(-1, 1, 8, 8)}, verilog=False,
                       log=messages.append)
    return out, result, messages


def onnx_macs(path) -> "dict[str, int]":
    """MACs per Conv/Gemm node from the ONNX weight shapes and inferred output shapes."""
    model = onnx.shape_inference.infer_shapes(onnx.load(path))
    graph = model.graph
    shapes = {init.name: tuple(init.dims) for init in graph.initializer}
    for info in graph.value_info:
        shapes[info.name] = tuple(d.dim_value for d in info.type.tensor_type.shape.dim)
    macs = {}
    for node in graph.node:
        if node.op_type == "Conv":
            cout, cin, kh, kw = shapes[node.input[1]]
            oh, ow = shapes[node.output[0]][2:]
            macs[node.name] = oh * ow * cout * cin * kh * kw
        elif node.op_type == "Gemm":
            a, b = shapes[node.input[1]]
            macs[node.name] = a * b
    return macs


def test_build_writes_the_build_folder(built):
    out, result, messages = built
    for name in FILES:
        assert (out / name).is_file(), name
    assert not (out / "accel.v").exists()                    # verilog=False
    assert ArchConfig.from_json((out / "arch.json").read_text()) == PRESETS["small"]
    assert result.out_dir == out
    assert len(messages) == 2 and messages[-1].startswith(f"Build written to {out}/")


def test_program_files_agree(built):
    out, result, _ = built
    doc = json.loads((out / "program.json").read_text())
    lines = (out / "prog.hex").read_text().splitlines()
    assert len(lines) == len(doc["instructions"]) == len(result.program.instructions)
    assert all(len(line) == -(-instruction_width() // 4) for line in lines)
    names = [Op.NAMES[decode(int(line, 16))["op"]] for line in lines]
    assert names == [i["name"] for i in doc["instructions"]]
    assert names[-1] == "END"
    report = json.loads((out / "report.json").read_text())
    for image in ("wgt", "par"):
        text = (out / f"{image}.hex").read_text().splitlines()
        assert len(text) == report["buffers"][image]["used"] > 0
        assert all(re.fullmatch(r"[0-9a-f]+", line) for line in text)


def test_report_layers_and_macs(built):
    out, result, _ = built
    report = json.loads((out / "report.json").read_text())
    assert report == json.loads(json.dumps(result.report))
    macs = onnx_macs(example_path("digits_cnn"))
    layers = report["layers"]
    assert [layer["name"] for layer in layers] == list(macs)
    assert [layer["macs"] for layer in layers] == list(macs.values())
    assert report["total"]["macs"] == sum(macs.values()) == result.program.macs
    pes = report["arch"]["rows"] * report["arch"]["cols"]
    for layer in layers:
        assert layer["predicted_cycles"] > 0
        assert 0 < layer["utilization"] <= 1
        assert layer["utilization"] == pytest.approx(
            layer["macs"] / (layer["predicted_cycles"] * pes))
    total = report["total"]
    assert total["predicted_cycles"] == sum(layer["predicted_cycles"] for layer in layers)
    assert 0 < total["utilization"] <= 1
    for buffer in report["buffers"].values():
        assert 0 < buffer["used"] <= buffer["depth"]
    assert report["quantization"]["calibration_samples"] == 200
    markdown = (out / "report.md").read_text()
    for layer in layers:
        assert f"| {layer['name']} | {layer['op']} | {layer['macs']:,} |" in markdown


def test_golden_simulation_accuracy(built, digits):
    out, result, _ = built
    images = digits["test_images"].reshape(-1, 1, 8, 8)
    sim = api.simulate(out, {"image": images}, mode="golden")
    logits = sim.outputs["logits"]
    assert logits.shape == (len(images), 10) and logits.dtype == np.float32
    assert sim.int_outputs.dtype == np.int8 and sim.int_outputs.shape == (len(images), 10)
    assert sim.cycles == [] and sim.utilization == 0.0
    assert sim.predicted_cycles == result.report["total"]["predicted_cycles"]
    assert sim.macs == result.program.macs and sim.pes == 64
    accuracy = (logits.argmax(axis=1) == digits["test_labels"]).mean()
    assert accuracy >= 0.95
    # the in-memory build and the folder (graph.json/npz round trip) agree bit for bit
    again = api.simulate(result, {"image": images}, mode="golden")
    np.testing.assert_array_equal(again.int_outputs, sim.int_outputs)


def test_golden_simulation_from_a_sample_file(built, digits, tmp_path):
    out, _, _ = built
    flat = digits["test_images"][:7]
    np.save(tmp_path / "x.npy", flat.reshape(7, 8, 8)[:, None])
    np.savez(tmp_path / "x.npz", image=flat.reshape(7, 1, 1, 8, 8))
    from_npy = api.simulate(out, tmp_path / "x.npy", mode="golden")
    from_npz = api.simulate(out, tmp_path / "x.npz", mode="golden")
    from_dict = api.simulate(out, {"image": flat.reshape(7, 1, 8, 8)}, mode="golden")
    np.testing.assert_array_equal(from_npy.int_outputs, from_dict.int_outputs)
    np.testing.assert_array_equal(from_npz.int_outputs, from_dict.int_outputs)


def test_build_without_calib(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(QuantizationError, match=re.escape(
            "Calibration data is required to quantize a float model: pass --calib "
            "samples.npz (one array per input, first axis = samples) or an .npy for a "
            "single-input model").join("^$")):
        api.build(example_path("digits_cnn"), out, verilog=False, log=lambda _: None)
    assert not out.exists()


def test_build_with_calib_of_the_wrong_shape(tmp_path, digits):
    with pytest.raises(QuantizationError, match=re.escape(
            "Calibration data: array 'image' has shape (200, 64), but samples of input "
            "'image' (1, 1, 8, 8) need shape (S, 1, 1, 8, 8) or (S, 1, 8, 8)").join("^$")):
        api.build(example_path("digits_cnn"), tmp_path / "out", calib={"image": digits["calib"]},
                  verilog=False, log=lambda _: None)


def test_simulate_a_folder_that_is_not_a_build(tmp_path):
    with pytest.raises(ModelError, match=re.escape(
            f"'{tmp_path}' is not an hwonnx build folder (no program.json); run "
            f"'hwonnx build MODEL -o {tmp_path}' first").join("^$")):
        api.simulate(tmp_path, {"image": np.zeros((1, 1, 8, 8))}, mode="golden")
