"""``hwonnx build --ext-memory`` then ``hwonnx sim --compare``, as a user runs them, for every
kind of program the compiler writes with an external memory: weights streamed (LOADX) beside
tensors that live in the external memory (LOADA, STOREA and their fences), tensors spilled
with the input and output themselves in the external memory, a paged program (LOADP) and a
segmented build (host steps between two segments that each spill). Each build folder is read
back by ``sim``, which runs it on the RTL bit-exact with golden in the predicted cycles.

The folder check derives each instruction's fields from the ISA (``hwonnx/isa.py``): it
refused every folder whose LOADA or STOREA carried ``fence`` (issue 36: ResNet-18, MobileNetV2
and a YOLO-style detector built with ``--ext-memory ulx3s-sdram``). The three non-paged
builds share one architecture (one Verilator build), the paged one has its own."""

import json
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hwonnx.cli import main

from compiler_helpers import spilled_model
from rtl_helpers import he_weight

#: The buffers of the streamed, spilled and segmented builds: 300 activation words (the
#: tensors of 16 channels move out), 512 weight words (the residual model's weights stream).
SMALL = ["--act-depth", "300", "--wgt-depth", "512", "--acc-depth", "256", "--par-depth", "64",
         "--prog-depth", "512"]
W = 16


def _convs(height: int, channels: "list[int]", kernels: "list[int]", seed: int,
           softmax_after: "int | None" = None) -> onnx.ModelProto:
    """x [1, channels[0], height, 16] -> Conv ``kernels[k]`` x ``kernels[k]`` (same padding)
    from ``channels[k]`` to ``channels[k + 1]`` channels, a Relu after each but the last, and
    after the Relu of Conv ``softmax_after`` a Softmax over the channels (a host step in the
    middle: two segments) -> y."""
    rng = np.random.default_rng(seed)
    inits, nodes, value = [], [], "x"
    for k, kernel in enumerate(kernels):
        gain = 4.0 if softmax_after is not None and k == softmax_after + 1 else 1.0
        inits.append(numpy_helper.from_array(
            he_weight(rng, channels[k + 1], channels[k], kernel, kernel, gain=gain), f"w{k}"))
        out = "y" if k == len(kernels) - 1 else f"c{k}"
        nodes.append(helper.make_node("Conv", [value, f"w{k}"], [out], name=f"conv{k}",
                                      pads=[kernel // 2] * 4))
        if out != "y":
            nodes.append(helper.make_node("Relu", [out], [f"r{k}"], name=f"relu{k}"))
            value = f"r{k}"
            if k == softmax_after:
                nodes.append(helper.make_node("Softmax", [value], ["s"], name="softmax",
                                              axis=1))
                value = "s"
    graph = helper.make_graph(
        nodes, "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels[0], height, W])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels[-1], height, W])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _build(tmp_path, capsys, model: onnx.ModelProto, options: "list[str]"):
    """``hwonnx build model.onnx -o out --board sim --calib calib.npz --ext-memory
    ulx3s-sdram OPTIONS`` (8 calibration samples), and ``x.npz`` of 2 samples beside it."""
    onnx.save(model, tmp_path / "model.onnx")
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim][1:]
    samples = np.random.default_rng(1).random((10, *shape)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=samples[:8])
    np.savez(tmp_path / "x.npz", x=samples[8:])
    out = tmp_path / "out"
    code = main(["build", str(tmp_path / "model.onnx"), "-o", str(out), "--board", "sim",
                 "--calib", str(tmp_path / "calib.npz"), "--ext-memory", "ulx3s-sdram",
                 *options])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return out


def _sim_compare(tmp_path, capsys, out) -> str:
    """``hwonnx sim out --input x.npz --compare``: exit status 0, the RTL equal to golden bit
    for bit, the two samples' cycles those predicted (``report.json``'s total). Returns what
    it printed."""
    code = main(["sim", str(out), "--input", str(tmp_path / "x.npz"), "--compare"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "error" not in captured.err and "Traceback" not in captured.err
    predicted = json.loads((out / "report.json").read_text())["total"]["predicted_cycles"]
    lines = captured.out.splitlines()
    assert re.fullmatch(rf"2 sample\(s\) on RTL: {predicted:,} cycles per sample \(predicted "
                        rf"{predicted:,}\), .*", lines[0]), captured.out
    assert "RTL equals the golden model bit for bit" in lines
    return captured.out


def _program(folder) -> "tuple[dict, list[dict]]":
    """The architecture and instructions of the build (or segment) folder ``folder``."""
    doc = json.loads((folder / "program.json").read_text())
    return doc["arch"], doc["instructions"]


def _fenced_loads(instructions) -> int:
    return sum(1 for i in instructions if i["name"] == "LOADA" and i.get("fence") == 1)


@pytest.mark.rtl
def test_streamed_weights_and_fenced_transfers_simulate_bit_exact(tmp_path, capsys):
    """The residual model (convolutions, a max pool, an element-wise Add, a depthwise
    convolution, a global pool and a Gemm) on 300 activation and 512 weight words: weights
    stream (LOADX), its largest tensors move through the staging buffers (LOADA, STOREA), the
    first LOADA of a band a fence. The folder check refused it ('instruction 2 must hold an
    op, its layer and instruction fields, all integers')."""
    out = _build(tmp_path, capsys, spilled_model(), SMALL)
    arch, instructions = _program(out)
    names = {i["name"] for i in instructions}
    assert {"LOADX", "LOADA", "STOREA", "ELTW"} <= names
    assert _fenced_loads(instructions) > 0
    assert (arch["wgt_depth"], arch["prog_page"]) == (512, 0)
    _sim_compare(tmp_path, capsys, out)


@pytest.mark.rtl
def test_spilled_input_and_output_simulate_bit_exact(tmp_path, capsys):
    """Three convolutions of a 24x16 image on 300 activation words: the input and the output
    live in the external memory (sim writes the one there and reads the other back), every
    tensor between them too; no weight streams."""
    out = _build(tmp_path, capsys, _convs(24, [8, 16, 16, 8], [3, 1, 3], seed=3), SMALL)
    doc = json.loads((out / "program.json").read_text())
    assert [doc["placements"][v]["memory"] for v in ("x:q", "y:q")] == ["ext", "ext"]
    names = {i["name"] for i in doc["instructions"]}
    assert {"LOADA", "STOREA"} <= names and "LOADX" not in names
    assert _fenced_loads(doc["instructions"]) > 0
    _sim_compare(tmp_path, capsys, out)


@pytest.mark.rtl
def test_a_paged_program_simulates_bit_exact(tmp_path, capsys):
    """Eight 3x3 convolutions of a 24x16 image on 300 activation words, in bands of rows: 566
    instructions, more than two pages of 256, so the build pages the program (prog_page): it
    boots from the external memory (prog.hex empty) and a LOADP copies its third page."""
    model = _convs(24, [8] + [16] * 7 + [8], [3] * 8, seed=4)
    out = _build(tmp_path, capsys, model, ["--act-depth", "300"])
    arch, instructions = _program(out)
    assert (arch["prog_page"], arch["prog_depth"]) == (256, 512)
    assert len(instructions) > 2 * 256
    assert sum(1 for i in instructions if i["name"] == "LOADP") == 1
    assert (out / "prog.hex").read_text() == ""
    assert _fenced_loads(instructions) > 0
    _sim_compare(tmp_path, capsys, out)


@pytest.mark.rtl
def test_a_segmented_build_simulates_bit_exact(tmp_path, capsys):
    """A Softmax over channels between a convolution and two more (28x16 image): two segments
    with the Softmax on the host between them, each spilling its tensors (staging buffers of
    128 words given), one architecture for both. sim runs both and prints each one's cycles,
    equal to its prediction. (The build refused the staging depths with an external memory,
    'Invalid architecture: ArchConfig.stage_in_depth and stage_out_depth must be 0 or, with an
    external memory, both positive integers', and sized the segments' memory model to one
    word.)"""
    model = _convs(28, [8, 16, 16, 8], [3, 3, 3], seed=5, softmax_after=0)
    out = _build(tmp_path, capsys, model,
                 SMALL + ["--stage-in-depth", "128", "--stage-out-depth", "128"])
    segments = json.loads((out / "segments.json").read_text())["segments"]
    assert [s["folder"] for s in segments] == ["segment1", "segment2"]
    assert segments[1]["host_steps_before"] == ["softmax"]
    docs = [json.loads((out / s["folder"] / "program.json").read_text()) for s in segments]
    for doc in docs:
        assert _fenced_loads(doc["instructions"]) > 0
    # one architecture, its memory model sized to the larger segment's tensors: 2,240 words
    # (x and relu0's output; softmax's, relu1's and y) in 4,096
    assert [doc["words"]["ext"] for doc in docs] == [448 + 896, 896 + 896 + 448]
    assert [(doc["arch"]["stage_in_depth"], doc["arch"]["stage_out_depth"],
             doc["arch"]["ext_depth"]) for doc in docs] == [(128, 128, 4096)] * 2
    predicted = [doc["predicted_cycles"] for doc in docs]
    printed = _sim_compare(tmp_path, capsys, out)
    for index, cycles in enumerate(predicted):
        assert f"  segment {index + 1}: {cycles:,} cycles per sample (predicted {cycles:,})" \
            in printed.splitlines()


def test_build_takes_staging_depths_with_an_external_memory(tmp_path, capsys):
    """``--stage-in-depth`` and ``--stage-out-depth`` need the external memory that
    ``--ext-memory`` adds: they were applied before it and refused ('Invalid architecture:
    ArchConfig.stage_in_depth and stage_out_depth must be 0 or, with an external memory, both
    positive integers, not (256, 256)'). An invalid array is still refused by name."""
    stages = ["--stage-in-depth", "256", "--stage-out-depth", "256"]
    out = _build(tmp_path, capsys, _convs(24, [8, 16, 16, 8], [3, 1, 3], seed=3),
                 SMALL + stages)
    arch = json.loads((out / "arch.json").read_text())
    assert (arch["ext_memory"], arch["stage_in_depth"], arch["stage_out_depth"]) == \
        ("ulx3s-sdram", 256, 256)
    code = main(["build", str(tmp_path / "model.onnx"), "-o", str(tmp_path / "other"),
                 "--ext-memory", "ulx3s-sdram", "--cols", "0", *stages])
    assert (code, capsys.readouterr()) == (2, ("", "hwonnx: error: Invalid architecture: "
                                                   "ArchConfig.cols must be a positive "
                                                   "integer, not 0\n"))
    assert not (tmp_path / "other").exists()
