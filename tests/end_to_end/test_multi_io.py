"""Graphs with several inputs and several outputs, without the RTL
(tests/end_to_end/test_multi_io_rtl.py runs them on Verilator): each input quantized and placed,
each output placed and dequantized; golden against onnxruntime's reference path on the QDQ model
quantize_static makes of them (the same quantization parameters), and against the float model; host
steps per input and per output; the build folder, the report, ``hwonnx sim --golden`` with an .npz
of two inputs, ``hwonnx run`` against a board stand-in, and mismatch localization naming the
output."""

import json
import re

import numpy as np
import onnx
import pytest
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, \
    quantize_static

from hwonnx import api
from hwonnx.cli import main
from hwonnx.errors import MismatchError
from hwonnx.golden import evaluate
from hwonnx.report import placement

from multi_io_models import MODELS, samples, two_heads, two_images_concat
from ort_reference import reference_outputs
from helpers import quiet


VARIANTS = {**MODELS, "two_images_concat_host": lambda rng: two_images_concat(rng, host=True),
            "two_heads_no_host": lambda rng: two_heads(rng, host=False)}


def _built(name, out=None, **options):
    rng = np.random.default_rng(sorted(VARIANTS).index(name))
    model, shapes = VARIANTS[name](rng)
    result = api.build(model, out, calib=samples(rng, shapes, 64), verilog=False, log=quiet,
                       **options)
    return model, shapes, result, rng


def _flat(x: "dict[str, np.ndarray]") -> "dict[str, np.ndarray]":
    """Samples ``[S, 1, ...]`` as onnxruntime takes them one at a time, ``[S, ...]``."""
    return {k: v.reshape(len(v), *v.shape[2:]) for k, v in x.items()}


# placement ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_input_and_output_is_placed(name):
    """Each Quantize is an input of the program and each Dequantize an output, in graph
    order; the inputs lie side by side from word 0 (the host writes them as one span)."""
    graph, program = _built(name)[2].graph, _built(name)[2].program
    quantizers = [n for n in graph.nodes if n.op == "Quantize"]
    dequantizers = [n for n in graph.nodes if n.op == "Dequantize"]
    assert [(p.name, p.value) for p in program.inputs] == \
        [(n.inputs[0], n.outputs[0]) for n in quantizers]
    assert [(p.name, p.value) for p in program.outputs] == \
        [(n.outputs[0], n.inputs[0]) for n in dequantizers]
    base = 0
    for port in program.inputs:
        where = program.placements[port.value]
        assert (where.base, where.shape) == (base, graph.types[port.value].shape)
        base += where.words
    regions = sorted((program.placements[p.value].base, program.placements[p.value].words)
                     for p in program.outputs)
    assert all(a + n <= b for (a, n), (b, _) in zip(regions, regions[1:]))   # disjoint


def test_port_counts():
    counts = {name: (len(_built(name)[2].program.inputs), len(_built(name)[2].program.outputs))
              for name in ("two_images_concat", "two_vectors_residual", "autoencoder",
                           "two_heads")}
    assert counts == {"two_images_concat": (2, 1), "two_vectors_residual": (2, 1),
                      "autoencoder": (1, 2), "two_heads": (1, 3)}


def test_a_single_input_program_keeps_its_one_port_accessors():
    """``input_value`` and friends are those of the one input and output; with several they
    are a bug in the caller, not a silent choice of the first."""
    program = _built("autoencoder")[2].program
    assert program.input_value == "x:q"
    with pytest.raises(ValueError, match="^The program has 2 outputs, not one: use "
                                         "Program.outputs$"):
        program.output_value


# golden against the references ---------------------------------------------------------------

class _Reader(CalibrationDataReader):
    def __init__(self, calib):
        count = len(next(iter(calib.values())))
        self.data = iter([{k: v[i] for k, v in calib.items()} for i in range(count)])

    def get_next(self):
        return next(self.data, None)


@pytest.mark.parametrize("name", ["two_images_concat", "two_vectors_residual", "autoencoder",
                                  "two_heads_no_host"])
def test_golden_equals_onnxruntime_reference_on_the_qdq_model(tmp_path, name):
    """quantize_static makes a QDQ model of several inputs or outputs; hwonnx imports its
    parameters (no calibration) and every output of the golden model is within 1 LSB of
    onnxruntime's reference path (graph optimizations off: QDQ as float ops), as the
    arithmetic contract allows for the rounding of ties."""
    rng = np.random.default_rng(5)
    model, shapes = VARIANTS[name](rng)
    onnx.save(model, tmp_path / "float.onnx")
    quantize_static(str(tmp_path / "float.onnx"), str(tmp_path / "qdq.onnx"),
                    _Reader(samples(rng, shapes, 32)), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8)
    result = api.build(tmp_path / "qdq.onnx", None, calib=None, verilog=False, log=quiet)
    x = samples(rng, shapes, 24)
    golden = api.simulate(result, x, mode="golden")
    names = [o.name for o in model.graph.output]
    scales = {p["name"]: p["scale"] for p in result.report["io"]["outputs"]}
    assert sorted(scales) == sorted(names)
    for output, want in zip(names, reference_outputs(tmp_path / "qdq.onnx", _flat(x))):
        got = golden.outputs[output].reshape(want.shape)
        lsb = np.abs(got.astype(np.float64) - want) / scales[output]
        assert lsb.max() <= 1 + 1e-3, (output, lsb.max())


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_golden_is_close_to_the_float_model(name):
    """On the calibration samples (inside every calibrated range: a value beyond it saturates
    there and in every layer after it), every output the accelerator computes is, dequantized,
    within 6 LSB of its scale (mean under 1 LSB) of the float model's (onnxruntime, float32),
    so no input or output lost its signal; the Softmax on the host (on one head) is within
    0.05 of the float one, and the ArgMax on the host (on another) is that of the golden
    output beside it."""
    rng = np.random.default_rng(sorted(VARIANTS).index(name))
    model, shapes = VARIANTS[name](rng)
    x = samples(rng, shapes, 64)
    result = api.build(model, None, calib=x, verilog=False, log=quiet)
    golden = api.simulate(result, x, mode="golden")
    names = [o.name for o in model.graph.output]
    assert sorted(golden.outputs) == sorted(names)
    ports = {p["name"]: p for p in result.report["io"]["outputs"]}
    for output, want in zip(names, reference_outputs(model, _flat(x))):
        got = golden.outputs[output].reshape(want.shape)
        if output == "box_class":
            np.testing.assert_array_equal(got, golden.outputs["boxes"].argmax(axis=1)[:, None])
        elif output == "probs":
            assert np.abs(got - want).max() < 0.05
        else:
            scale = ports[output]["scale"]
            lsb = np.abs(got - want) / scale
            assert lsb.max() <= 6 and lsb.mean() < 1, (output, lsb.max(), lsb.mean())


def test_host_steps_per_input_and_output():
    """Each input with its own host prefix (an NHWC -> NCHW Transpose on one, a
    normalization on the other), each quantized from its prefix's result; a Softmax and an
    ArgMax on the host after two different outputs of three."""
    _, _, result, _ = _built("two_images_concat_host")
    rows = {row["node"]: row for row in placement(result.graph)}
    assert [rows[n]["where"] for n in ("nchw_a", "center_b", "scale_b", "conv_a", "conv_b")] \
        == ["host", "host", "host", "hardware", "hardware"]
    for node in ("nchw_a", "scale_b"):
        assert rows[node]["why"].endswith("at the start of the graph, before the "
                                          "accelerator's input")
    assert [p.name for p in result.program.inputs] == ["at", "bn"]
    assert result.program.placements["at:q"].shape == (1, 3, 6, 5)
    heads = _built("two_heads")[2]
    rows = {row["node"]: row for row in placement(heads.graph)}
    assert (rows["softmax"]["where"], rows["argmax"]["where"]) == ("host", "host")
    reads = {n.name: n.inputs[0] for n in heads.graph.nodes}
    assert (reads["softmax"], reads["argmax"]) == ("logits", "boxes")
    assert sorted(p.name for p in heads.program.outputs) == ["boxes", "f2", "logits"]


# build folder, report, CLI --------------------------------------------------------------------

def test_build_folder_and_report_list_every_port(tmp_path):
    out = tmp_path / "out"
    _, shapes, result, _ = _built("two_images_concat", out)
    graph = result.graph
    program = json.loads((out / "program.json").read_text())
    assert program["inputs"] == [{"name": "a", "value": "a:q"}, {"name": "b", "value": "b:q"}]
    assert program["outputs"] == [{"name": "y", "value": "y:q"}]
    report = json.loads((out / "report.json").read_text())
    for entry in report["io"]["inputs"]:
        node = graph.producer(entry["value"])
        where = result.program.placements[entry["value"]]
        assert entry == {"name": node.inputs[0], "value": node.outputs[0],
                         "shape": list(shapes[entry["name"]]),
                         "scale": node.attrs["scale"], "zero_point": node.attrs["zero_point"],
                         "base": where.base, "words": where.words, "memory": "act"}
    (entry,) = report["io"]["outputs"]
    node = next(n for n in graph.nodes if n.op == "Dequantize")
    assert (entry["scale"], entry["zero_point"], entry["shape"]) == \
        (node.attrs["scale"], node.attrs["zero_point"], [1, 3, 6, 5])
    md = (out / "report.md").read_text()
    assert re.search(r"^\| input \| a \| 1x3x6x5 \| [\d.e-]+ \| -?\d+ \| 0\.\.\.29 \|$", md,
                     re.M)
    assert re.search(r"^\| input \| b \| 1x2x6x5 \| [\d.e-]+ \| -?\d+ \| 30\.\.\.59 \|$", md,
                     re.M)
    loaded = api.load_build(out)
    assert (loaded.program.inputs, loaded.program.outputs) == \
        (result.program.inputs, result.program.outputs)


def test_cli_sim_golden_takes_an_npz_of_two_inputs(tmp_path, capsys):
    out = tmp_path / "out"
    _, shapes, result, rng = _built("two_images_concat", out)
    x = samples(rng, shapes, 5)
    np.savez(tmp_path / "x.npz", **x)
    assert main(["sim", str(out), "--input", str(tmp_path / "x.npz"), "--golden",
                 "--output", str(tmp_path / "y.npz")]) == 0
    assert "5 sample(s) on the golden model" in capsys.readouterr().out
    want = api.simulate(result, x, mode="golden").outputs["y"]
    with np.load(tmp_path / "y.npz") as npz:
        assert sorted(npz.files) == ["y"]
        np.testing.assert_array_equal(npz["y"], want)
    np.savez(tmp_path / "a_only.npz", a=x["a"])
    assert main(["sim", str(out), "--input", str(tmp_path / "a_only.npz"), "--golden"]) == 2
    assert "'b'" in capsys.readouterr().err


def test_cli_sim_writes_every_output(tmp_path, capsys):
    out = tmp_path / "out"
    _, shapes, result, rng = _built("two_heads", out)
    np.savez(tmp_path / "x.npz", **samples(rng, shapes, 3))
    assert main(["sim", str(out), "--input", str(tmp_path / "x.npz"), "--golden",
                 "--output", str(tmp_path / "y.npz")]) == 0
    with np.load(tmp_path / "y.npz") as npz:
        assert sorted(npz.files) == ["box_class", "boxes", "f2", "probs"]
        assert npz["box_class"].dtype == np.int64 and npz["box_class"].shape == (3, 1, 8, 8)
        assert npz["boxes"].shape == (3, 4, 8, 8)


def test_run_on_a_board_writes_every_input_and_reads_every_output(tmp_path, monkeypatch):
    """``hwonnx run`` over the UART protocol to a board stand-in that computes with the golden
    model from the words the host wrote at each input's placement and returns each output's
    words: the decoded outputs equal the golden model's."""
    from tests.boards.test_run_board import FakeBoard

    from hwonnx.boards import host
    from hwonnx.boards.build import build_id

    for name in ("two_vectors_residual", "autoencoder"):
        out = tmp_path / name
        _, shapes, result, rng = _built(name, out, board="ulx3s-85f")
        board = FakeBoard(result, build_id(result.program))
        monkeypatch.setattr(host, "SerialTransport", lambda port, baud, timeout: board)
        x = samples(rng, shapes, 3)
        got = api.run_board(out, "/dev/ttyFAKE", x, log=quiet)
        want = api.simulate(out, x, mode="golden")
        assert sorted(got.int_values) == sorted(p.value for p in result.program.outputs)
        for value in got.int_values:
            np.testing.assert_array_equal(got.int_values[value], want.int_values[value])
        for output in want.outputs:
            np.testing.assert_array_equal(got.outputs[output], want.outputs[output])
        written = {a for a in board.memory}
        for port in result.program.inputs:
            where = result.program.placements[port.value]
            assert set(range(where.base, where.base + where.words)) <= written


def test_compare_names_the_output_that_differs(monkeypatch):
    """A wrong value in one output of the RTL (here a stand-in that computes with the golden
    model and flips one value of ``recon`` in the last sample it runs) is reported as that
    output's, and localized to the layer that writes it."""
    import hwonnx.sim

    _, shapes, result, rng = _built("autoencoder")
    graph = result.graph

    def corrupted(program, feeds, values=None, log=print, max_cycles=None):
        env = evaluate(graph, {k: v.reshape((-1,) + v.shape[2:]) for k, v in feeds.items()},
                       keep_all=True, downstream=True)
        values = values or [p.value for p in program.outputs]
        got = {v: env[v].reshape((-1,) + program.placements[v].shape).copy() for v in values}
        if "recon:q" in got:
            got["recon:q"][-1, 0, 3] ^= 1
        cycles = api.predict(program.expanded(), program.config).total
        return got, hwonnx.sim.RunResult([], [cycles] * len(env["x:q"]), 0, 0.0, 0.0)

    monkeypatch.setattr(hwonnx.sim, "execute_program", corrupted)
    with pytest.raises(MismatchError, match=r"^RTL differs from the golden model in output "
                       r"'recon': sample 1: layer 'decoder' \(QDense\) output differs first at "
                       r"index \(0, 3\): RTL -?\d+, golden -?\d+$"):
        api.simulate(result, samples(rng, shapes, 2), mode="compare", log=quiet)


def test_an_input_that_is_also_an_output_is_passed_through():
    from multi_io_models import input_and_result

    rng = np.random.default_rng(2)
    model, shapes = input_and_result(rng)
    result = api.build(model, None, calib=samples(rng, shapes, 16), verilog=False, log=quiet)
    x = samples(rng, shapes, 3)
    golden = api.simulate(result, x, mode="golden")
    np.testing.assert_array_equal(golden.outputs["x"], x["x"].reshape(3, 8))
    assert [p.name for p in result.program.outputs] == ["y"]


def test_two_outputs_of_one_placement():
    """An output and its Flatten, both outputs: two ports of one placement, each read back
    with its own logical shape."""
    from multi_io_models import map_and_flattened

    rng = np.random.default_rng(4)
    model, shapes = map_and_flattened(rng)
    result = api.build(model, None, calib=samples(rng, shapes, 16), verilog=False, log=quiet)
    program = result.program
    assert program.placements["c:q"].base == program.placements["f:q"].base
    golden = api.simulate(result, samples(rng, shapes, 3), mode="golden")
    np.testing.assert_array_equal(golden.outputs["f"], golden.outputs["c"].reshape(3, 36))
