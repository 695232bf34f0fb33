"""Host steps in the middle of a graph: program segments with host round trips between them.

Four models: a Softmax over channels between two convolutions, a Div of two computed tensors
(``a / (relu(b) + 1)``, the Add of a constant that no bias absorbs on the host too), a skip
connection across a boundary (a residual Add of a value made before the Softmax), and a model
of three segments with two outputs (an intermediate feature map, and a final Softmax at the
end). The golden model against onnxruntime's reference path (float model: a stated bound in
output LSB; each host step exactly, on the golden model's own dequantized inputs; each host
result's parameters from its float range), the RTL against golden bit for bit in the
predicted cycles of every segment, mismatch localization naming the segment, the report's and
``hwonnx inspect``'s segments and round-trip bytes, and the build folder's format. Which
operators the host runs in the middle, and what neither side runs:
tests/host_steps/test_host_middle.py."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from hwonnx.api import build, first_difference, load_build, simulate
from hwonnx.cli import main
from hwonnx.compiler.timing import predict
from hwonnx.errors import MismatchError, UsageError

from ort_reference import reference_outputs
from rtl_helpers import CONFIGS
from helpers import quiet
from host_steps_helpers import (MODELS, conv_node, onnx_model, scale_of, segmented_build,
                                softmax_middle, three_segments)


#: Host steps between segments, and segments, of each model.
MIDDLE = {"softmax_middle": (["softmax"], 2), "div_computed": (["add_one", "div"], 2),
          "skip_across": (["softmax"], 2), "three_segments": (["softmax", "logsoftmax"], 3)}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_golden_within_bounds_of_onnxruntime_reference(name, tmp_path):
    """Every output of the golden model on the calibration data (64 samples: other samples
    may saturate beyond the calibrated ranges, the ranges' error, not the segments') against
    the float model on onnxruntime's reference path: an int8 output within 3 LSB of its scale (mean
    under 0.6 LSB; measured: at most 2.0, mean at most 0.46), the final Softmax's
    probabilities within 0.01 (measured 0.0016). The int8 outputs are float over int8
    programs and float host steps: a host round trip adds the error of one requantization."""
    model, result, x = segmented_build(name, tmp_path, count=64)
    golden = simulate(result, x, mode="golden")
    names = [o.name for o in model.graph.output]
    for output, want in zip(names, reference_outputs(model, x)):
        got = golden.outputs[output].reshape(want.shape)
        if output == "probs":
            assert np.abs(got - want).max() <= 0.01
            continue
        lsb = np.abs(got - want) / scale_of(result.graph, output)
        assert lsb.max() <= 3 and lsb.mean() < 0.6, (output, lsb.max(), lsb.mean())


def _node_model(node, graph) -> onnx.ModelProto:
    """The host step ``node`` of the integer graph as a one-node ONNX model (its run-time
    inputs as graph inputs, its constants as initializers)."""
    inputs = [v for v in node.inputs if v not in graph.constants]
    attrs = {"axis": node.attrs["axis"]} if "axis" in node.attrs else {}
    onnx_node = helper.make_node(node.op, list(node.inputs), ["out"], **attrs)
    return onnx_model([onnx_node], {v: graph.constants[v] for v in node.inputs
                                    if v in graph.constants},
                      {v: list(graph.types[v].shape) for v in inputs},
                      {"out": list(graph.types[node.outputs[0]].shape)})


@pytest.mark.parametrize("name", sorted(MODELS))
def test_host_steps_equal_onnxruntime_on_their_inputs(name, tmp_path):
    """Each host step between segments, run by onnxruntime's reference path on the golden
    model's own inputs of the step (dequantized int8 results of the segment before): equal
    to the golden model's result within float32 rounding (Softmax, LogSoftmax: 1e-6
    relative; Div, Add: exact)."""
    from hwonnx.golden import evaluate

    _, result, x = segmented_build(name, tmp_path)
    graph = result.graph
    env = evaluate(graph, {"x": x["x"].reshape((-1,) + graph.types["x"].shape[1:])},
                   keep_all=True)
    steps, _ = MIDDLE[name]
    assert [n.name for n in graph.nodes if n.name in steps] == steps
    for node in (n for n in graph.nodes if n.name in steps):
        feeds = {v: env[v] for v in node.inputs if v not in graph.constants}
        [want] = reference_outputs(_node_model(node, graph), feeds)
        got = env[node.outputs[0]]
        if node.op in ("Softmax", "LogSoftmax"):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        else:
            np.testing.assert_array_equal(got, want)


#: The host results that a segment reads (each quantized with its own parameters).
HOST_RESULTS = {"softmax_middle": ["s"], "div_computed": ["q"], "skip_across": ["s"],
                "three_segments": ["s", "l"]}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_host_results_are_calibrated_on_their_float_values(name, tmp_path):
    """The Quantize of a host step's result takes the min-max parameters of the float value
    it has in the float model (onnxruntime's reference path on the calibration data):
    scale = (max(hi, 0) - min(lo, 0)) / 255, zero point round(-128 - min(lo, 0) / scale)."""
    model, result, _ = segmented_build(name, tmp_path)
    rng = np.random.default_rng(sorted(MODELS).index(name))
    MODELS[name](rng)            # the same generator state as segmented_build's calib data
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    calib = rng.uniform(-1, 1, (64, *shape[1:])).astype(np.float32)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for value in HOST_RESULTS[name]:
        probe.graph.output.append(helper.make_tensor_value_info(value, TensorProto.FLOAT, None))
    floats = reference_outputs(probe, {"x": calib})[len(model.graph.output):]
    for value, array in zip(HOST_RESULTS[name], floats):
        lo, hi = min(float(array.min()), 0.0), max(float(array.max()), 0.0)
        scale = (hi - lo) / 255
        node = next(n for n in result.graph.nodes if n.op == "Quantize" and n.inputs[0] == value)
        assert node.attrs["scale"] == pytest.approx(scale, rel=1e-5)
        assert node.attrs["zero_point"] == round(-128 - lo / scale)


@pytest.mark.rtl
@pytest.mark.parametrize("config_name", sorted(CONFIGS))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_rtl_equals_golden_per_segment_in_predicted_cycles(name, config_name, tmp_path):
    """Each segment a separate run of one Verilator model: every int8 value the host reads
    back equals golden, every output too, every segment takes its predicted cycles
    (``predict`` of its program) in every sample, and every layer of every segment equals
    golden (truncated programs)."""
    _, result, x = segmented_build(name, tmp_path, config=CONFIGS[config_name])
    steps, count = MIDDLE[name]
    assert len(result.segments) == count
    rtl = simulate(result, x, mode="compare", log=quiet)
    golden = simulate(result, x, mode="golden")
    assert sorted(rtl.int_values) == sorted(p.value for s in result.segments for p in s.outputs)
    for value, want in golden.int_values.items():
        np.testing.assert_array_equal(rtl.int_values[value], want)
    for output, want in golden.outputs.items():
        np.testing.assert_array_equal(rtl.outputs[output], want)
    predicted = [predict(p.expanded(), p.config).total for p in result.segments]
    assert rtl.segment_predicted == predicted
    assert rtl.segment_cycles == [[p] * len(x["x"]) for p in predicted]
    assert rtl.cycles == [sum(predicted)] * len(x["x"])
    assert first_difference(result, x, 1, log=quiet) == (
        "sample 1: every layer output matches; the difference is in the host I/O")


@pytest.mark.rtl
def test_mismatch_names_the_segment_and_layer(tmp_path):
    """A golden model whose segment-2 layer differs from the program the RTL runs (its bias
    changed): compare mode fails naming segment 2 of 2 and that layer, not segment 1."""
    from dataclasses import replace

    _, result, x = segmented_build("softmax_middle", tmp_path)
    graph = result.graph
    bias = np.array(graph.constants["conv2:bias"])
    bias[0] += 1 << 20
    changed = replace(result, graph=replace(graph, constants={**graph.constants,
                                                              "conv2:bias": bias}))
    with pytest.raises(MismatchError, match=r"RTL differs from the golden model in output "
                                            r"'y': sample 0: "
                                            r"segment 2 of 2, layer 'conv2' \(QConv\) output "
                                            r"differs first at index"):
        simulate(changed, x, mode="compare", log=quiet)


def test_report_lists_segments_and_round_trip_bytes(tmp_path):
    """report.json and report.md: each segment with the host steps before it, its ports and
    predicted cycles; each round trip with the bytes read back and written (activation
    words of 8 int8 lanes) and the UART's frames at 115,200 baud. softmax_middle on 8x8:
    f1 and s are [1, 8, 8, 8], 64 words of 8 bytes each way; one WRITE frame (7 bytes of
    frame, a 2-byte address, 512 bytes; an 8-byte reply) and one READ (7 + 4 bytes; a reply
    of 8 + 512 bytes): 1,060 bytes of 10 bits. div_computed: two values of [1, 4, 6, 6]
    (36 words each) read in two READs, one of 36 words written: 2 * 307 + 305 bytes."""
    _, result, _ = segmented_build("softmax_middle", tmp_path)
    report = json.loads((tmp_path / "softmax_middle" / "report.json").read_text())
    programs = result.segments
    assert [(s["index"], s["host_steps_before"], s["layers"], s["inputs"], s["outputs"])
            for s in report["segments"]] == [(1, [], ["conv1"], ["x:q"], ["f1:q"]),
                                             (2, ["softmax"], ["conv2"], ["s:q"], ["y:q"])]
    assert [s["predicted_cycles"] for s in report["segments"]] == [
        predict(p.expanded(), p.config).total for p in programs]
    assert report["total"]["predicted_cycles"] == sum(
        predict(p.expanded(), p.config).total for p in programs)
    [trip] = report["round_trips"]
    assert (trip["after_segment"], trip["host_steps"], trip["read_bytes"],
            trip["written_bytes"], trip["link_bytes"], trip["baud"]) == (
        1, ["softmax"], 512, 512, 1060, 115200)
    assert trip["link_seconds"] == pytest.approx(1060 * 10 / 115200)
    assert trip["read"] == [{"value": "f1:q", "elements": 512, "words": 64}]
    text = (tmp_path / "softmax_middle" / "report.md").read_text()
    assert "| 2 | softmax | conv2 | s:q | y:q |" in text
    assert "| 1 | softmax | f1:q | 512 | 512 | 1,060 | 92.0 ms at 115,200 baud |" in text
    assert "| input | s (segment 2) | 1x8x8x8 |" in text
    _, _, _ = segmented_build("div_computed", tmp_path)
    report = json.loads((tmp_path / "div_computed" / "report.json").read_text())
    [trip] = report["round_trips"]
    assert (trip["host_steps"], trip["read_bytes"], trip["written_bytes"],
            trip["link_bytes"]) == (["add_one", "div"], 576, 288, 2 * 307 + 305)


def test_inspect_lists_the_segments(tmp_path, capsys):
    """``hwonnx inspect`` places the model in segments, each host step between them on the
    host with its reason, and lists the round trip."""
    path = tmp_path / "three.onnx"
    onnx.save(three_segments(np.random.default_rng(0)), path)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "predicted cycles per inference in 3 segments" in out
    assert ("| logsoftmax | LogSoftmax | host |  |  | LogSoftmax has no hardware mapping; "
            "between accelerator segments: the host reads its input back and writes its "
            "result, quantized, into the next segment |") in out
    assert "| 3 | logsoftmax | conv3, pool, fc | l:q | logits:q |" in out
    assert "| conv2 | QConv | hardware, segment 2 |" in out
    assert "| 2 | logsoftmax | g:q |" in out


def test_segmented_build_folder(tmp_path):
    """A segmented build is a folder of format 4 (a reader of format 3 refuses it, naming the
    format) with segments.json and one program folder per segment; load_build reads it back,
    and its golden run equals the in-memory build's. An unsegmented build keeps format 3
    and its program at the top."""
    _, result, x = segmented_build("three_segments", tmp_path)
    out = tmp_path / "three_segments"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == 4
    assert {rel.split("/")[0] for rel in manifest["files"]} >= {
        "segments.json", "segment1", "segment2", "segment3", "graph.json"}
    assert not (out / "program.json").exists()
    doc = json.loads((out / "segments.json").read_text())["segments"]
    assert [(s["folder"], s["host_steps_before"]) for s in doc] == [
        ("segment1", []), ("segment2", ["softmax"]), ("segment3", ["logsoftmax"])]
    loaded = load_build(out)
    assert len(loaded.segments) == 3
    again, first = simulate(out, x, mode="golden"), simulate(result, x, mode="golden")
    for name in ("f1", "probs"):
        np.testing.assert_array_equal(again.outputs[name], first.outputs[name])
    plain = build(onnx_model([conv_node("conv", "x", "w", "y")], {"w": np.ones((2, 3, 1, 1))},
                             {"x": [1, 3, 4, 4]}, {"y": [1, 2, 4, 4]}), tmp_path / "plain",
                  calib={"x": x["x"][:, :, :4, :4]}, log=quiet, verilog=False)
    assert not plain.segments
    assert json.loads((tmp_path / "plain" / "manifest.json").read_text())["format"] == 3
    assert (tmp_path / "plain" / "program.json").exists()
    assert not (tmp_path / "plain" / "segments.json").exists()


def test_board_build_of_a_segmented_model_is_refused(tmp_path):
    """A board's program memory holds one program: a segmented model is refused for a board,
    by its segment count, and nothing is written."""
    rng = np.random.default_rng(0)
    with pytest.raises(UsageError, match=r"runs as 2 accelerator segments with host steps "
                                         r"between them; segmented builds run in simulation "
                                         r"only \(--board sim\)"):
        build(softmax_middle(rng), tmp_path / "board", board="ulx3s-85f", log=quiet,
              calib={"x": rng.uniform(-1, 1, (8, 3, 8, 8)).astype(np.float32)})
    assert not (tmp_path / "board").exists()


@pytest.mark.rtl
def test_cli_sim_compare_prints_each_segment(tmp_path, capsys):
    """``hwonnx sim --compare`` on a segmented build folder runs the segments and prints the
    cycles of each against its prediction."""
    _, result, x = segmented_build("softmax_middle", tmp_path, count=2)
    np.savez(tmp_path / "x.npz", x=x["x"])
    assert main(["sim", str(tmp_path / "softmax_middle"), "--input", str(tmp_path / "x.npz"),
                 "--compare"]) == 0
    out = capsys.readouterr().out
    for index, program in enumerate(result.segments):
        cycles = predict(program.expanded(), program.config).total
        assert f"  segment {index + 1}: {cycles:,} cycles per sample (predicted {cycles:,})" \
            in out


def test_a_value_crossing_a_boundary_is_written_again_unchanged(tmp_path):
    """skip_across: segment 2 reads f1:q, the int8 value segment 1 wrote, with its scale and
    zero point (no second Quantize of f1: the round trip is exact); three_segments: f1 is a
    graph output and read by the host's Softmax, so it is dequantized once."""
    _, result, _ = segmented_build("skip_across", tmp_path)
    first, second = result.segments
    assert [p.value for p in first.outputs] == ["f1:q"]
    assert sorted(p.value for p in second.inputs) == ["f1:q", "s:q"]
    graph = result.graph
    assert [n.op for n in graph.nodes if "f1:q" in n.outputs] == ["QConv"]
    assert not [n for n in graph.nodes if n.op == "Quantize" and n.inputs[0] == "f1"]
    [crossing] = [p for p in graph.meta["segments"][1]["inputs"] if p[1] == "f1:q"]
    [made] = [p for p in graph.meta["segments"][0]["outputs"] if p[0] == "f1:q"]
    assert crossing[2:] == made[2:]
    _, result, _ = segmented_build("three_segments", tmp_path)
    assert [n.name for n in result.graph.nodes if n.op == "Dequantize"] == [
        "dequantize_f1", "dequantize_g", "dequantize_logits"]


def test_hwonnx_run_refuses_a_segmented_folder(tmp_path):
    """``hwonnx run`` (a board) refuses a segmented simulation build before opening a port."""
    from hwonnx.api import run_board

    _, _, x = segmented_build("softmax_middle", tmp_path)
    with pytest.raises(UsageError, match=r"is a segmented simulation build; run it with "
                                         r"'hwonnx sim'"):
        run_board(tmp_path / "softmax_middle", "/dev/null-port", x, log=quiet)


def test_cli_sim_golden_prints_each_segments_prediction(tmp_path, capsys):
    _, result, x = segmented_build("three_segments", tmp_path, count=2)
    np.savez(tmp_path / "x.npz", x=x["x"])
    assert main(["sim", str(tmp_path / "three_segments"), "--input", str(tmp_path / "x.npz"),
                 "--golden"]) == 0
    lines = capsys.readouterr().out.splitlines()
    predicted = [predict(p.expanded(), p.config).total for p in result.segments]
    assert lines[:4] == [f"2 sample(s) on the golden model (predicted {sum(predicted):,} "
                         f"cycles per sample)"] + [
        f"  segment {i + 1}: predicted {p:,} cycles per sample" for i, p in enumerate(predicted)]
