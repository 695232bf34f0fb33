"""Samples never mix (issue 36, item 1): Keras ``Conv2D -> Flatten -> Dense`` and ``Conv1D ->
Flatten -> Dense`` exports write the ``Flatten`` with ``axis=0``, legal for a batch of 1
(everything into one row, ``[1, N]``). The golden model evaluated the calibration samples as
one batch and folded them into the features: ``build`` and ``inspect`` crashed in the
calibration check, ``sim --golden`` on several samples crashed the same way.

The references: each sample evaluated alone (the batch-1 model the graph says), and
onnxruntime's reference path (graph optimizations disabled) one sample at a time."""

import re

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from hwonnx import api
from hwonnx.frontend import load_model
from hwonnx.golden import evaluate
from hwonnx.golden.ops import flatten, reshape
from hwonnx.ir.evaluate import evaluate_float
from spec_helpers import make_model, rand
from cli_helpers import run

SAMPLES = 8


def conv_flatten_dense(spatial: "list[int]"):
    """Conv (3 -> 4 channels, kernel 3, pad 1) over an input of ``spatial`` size (one axis:
    Conv1D, two: Conv2D), Relu, ``Flatten`` with ``axis=0``, Gemm to 5, batch 1."""
    rank = len(spatial)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1] * 2 * rank),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flatten", axis=0),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], name="dense")]
    features = 4 * int(np.prod(spatial))
    inits = {"w": rand(4, 3, *[3] * rank) * 0.3, "b": rand(4, seed=1) * 0.1,
             "fw": rand(features, 5, seed=2) * 0.1, "fb": rand(5, seed=3) * 0.1}
    return make_model(nodes, {"x": [1, 3, *spatial]}, {"y": [1, 5]}, inits)


def onnxruntime_per_sample(model, xs: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"x": x})[0] for x in xs])


@pytest.mark.parametrize("spatial", [[6, 6], [12]], ids=["conv2d", "conv1d"])
def test_flatten_axis_0_builds_and_keeps_samples_apart(spatial, tmp_path, capsys):
    model = conv_flatten_dense(spatial)
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    xs = rand(SAMPLES, 1, 3, *spatial, seed=4)
    np.save(tmp_path / "x.npy", xs)

    code, out, err = run(capsys, "inspect", path)
    assert code == 0 and "Traceback" not in err, err
    out_dir = tmp_path / "out"
    code, out, err = run(capsys, "build", path, "-o", out_dir, "--calib", tmp_path / "x.npy")
    assert code == 0 and "Traceback" not in err, err
    code, out, err = run(capsys, "sim", out_dir, "--input", tmp_path / "x.npy", "--golden",
                         "--output", tmp_path / "y.npz")
    assert code == 0 and "Traceback" not in err, err

    # the golden result of each sample is that sample's result alone
    build = api.load_build(out_dir)
    together = api.run_golden(build, {"x": xs})
    with np.load(tmp_path / "y.npz") as saved:
        np.testing.assert_array_equal(saved["y"].reshape(SAMPLES, 5), together.outputs["y"])
    for i in range(SAMPLES):
        alone = api.run_golden(build, {"x": xs[i:i + 1]})
        np.testing.assert_array_equal(together.outputs["y"][i:i + 1], alone.outputs["y"])
        for value, q in together.int_values.items():
            np.testing.assert_array_equal(q[i:i + 1], alone.int_values[value])

    # the float graph on the whole batch follows onnxruntime one sample at a time
    graph = load_model(model)
    got = evaluate_float(graph, {"x": xs.reshape(SAMPLES, 3, *spatial)})["y"]
    want = onnxruntime_per_sample(model, xs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_golden_layout_ops_keep_each_sample_apart():
    x = np.arange(3 * 4 * 2 * 2, dtype=np.int8).reshape(3, 4, 2, 2)
    for axis in (0, 1):                   # at batch 1 both give [1, 16] per sample
        want = np.concatenate([x[i:i + 1].reshape(1, -1) for i in range(3)])
        np.testing.assert_array_equal(flatten(x, axis=axis), want)
    np.testing.assert_array_equal(reshape(x, shape=(1, 16)), x.reshape(3, 16))


@pytest.mark.parametrize("op, call, message", [
    ("Flatten", lambda x: flatten(x, axis=2),
     "Flatten to [4, 4] of samples of shape [1, 4, 2, 2]: the result must be one sample of "
     "the same size along a leading axis of 1"),
    ("Reshape", lambda x: reshape(x, shape=(2, 8)),
     "Reshape to [2, 8] of samples of shape [1, 4, 2, 2]: the result must be one sample of "
     "the same size along a leading axis of 1"),
    ("Reshape", lambda x: reshape(x, shape=(1, 15)),
     "Reshape to [1, 15] of samples of shape [1, 4, 2, 2]: the result must be one sample of "
     "the same size along a leading axis of 1"),
])
def test_golden_layout_ops_refuse_to_mix_samples(op, call, message):
    x = np.zeros((3, 4, 2, 2), np.int8)
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        call(x)


def test_golden_model_names_the_node_reading_a_value_of_another_shape():
    """A value whose samples do not have its IR shape is a clear error naming the node, not
    a NumPy traceback from inside the op."""
    result = api.build(conv_flatten_dense([6, 6]), None, calib={"x": rand(4, 3, 6, 6, seed=5)},
                       verilog=False, log=lambda *_: None)
    graph = result.graph
    dense = next(node for node in graph.nodes if node.op == "QDense")
    value = dense.inputs[0]
    feeds = {value: np.zeros((2, 4 * 6 * 6 + 1), np.int8)}
    with pytest.raises(ValueError, match="^" + re.escape(
            f"Node 'dense' (QDense) reads '{value}' of shape [2, 145], not a batch of 2 "
            f"samples of its IR shape [1, 144]") + "$"):
        evaluate(graph, feeds, downstream=True)
