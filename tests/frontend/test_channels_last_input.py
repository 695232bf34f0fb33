"""Keras channels-last models with a one-channel input, as tf2onnx writes them: the NHWC ->
NCHW change of ``[1, H, W, 1]`` is a Transpose that moves only the size-1 axis, or a Reshape
(issue 36: a DS-CNN keyword-spotting model, a Conv2D + MaxPool model). Either is a
relabelling: the compiler lays the input out as the image its readers take, and the host
writes it there. Built and simulated through the CLI, bit-exact in the predicted cycles, and
checked against onnxruntime's float model."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from rtl_helpers import cli_build_and_compare, he_weight
from spec_helpers import make_model, ort_outputs

pytestmark = pytest.mark.rtl


def _kws(relabel: str) -> onnx.ModelProto:
    """x [1, 49, 10, 1] -> (Transpose perm [0, 3, 1, 2] | Reshape [1, 1, 49, 10]) -> Conv 3x3
    1 -> 8 (same) -> Relu -> MaxPool 2x2 -> GlobalAveragePool -> Flatten -> Gemm 8 -> 4."""
    rng = np.random.default_rng(11)
    if relabel == "transpose":
        first = helper.make_node("Transpose", ["x"], ["t"], name="Conv__53_transpose",
                                 perm=[0, 3, 1, 2])
        inits = []
    else:
        first = helper.make_node("Reshape", ["x", "shape"], ["t"], name="Conv__53_reshape")
        inits = [numpy_helper.from_array(np.array([1, 1, 49, 10], np.int64), "shape")]
    nodes = [first,
             helper.make_node("Conv", ["t", "w"], ["c"], name="Conv__53", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["p"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "d"], ["y"], name="dense", transB=1)]
    model = make_model(nodes, {"x": [1, 49, 10, 1]}, {"y": [1, 4]})
    model.graph.initializer.extend(inits + [
        numpy_helper.from_array(he_weight(rng, 8, 1, 3, 3), "w"),
        numpy_helper.from_array((rng.normal(0, 0.5, (4, 8))).astype(np.float32), "d")])
    return model


@pytest.mark.parametrize("relabel", ["transpose", "reshape"])
def test_one_channel_channels_last_input_builds_and_runs_bit_exact(tmp_path, capsys, relabel):
    model = _kws(relabel)
    x = np.random.default_rng(3).normal(0, 1, (10, 1, 49, 10, 1)).astype(np.float32)
    got = cli_build_and_compare(tmp_path, capsys, model, x).reshape(2, 4)
    want = np.concatenate([ort_outputs(model, {"x": sample})[1][0] for sample in x[8:]])
    print(f"\n{relabel}: max |RTL - onnxruntime float| {np.abs(got - want).max():.4g} of an "
          f"output range {np.ptp(want):.4g}")
    assert np.abs(got - want).max() <= 0.05 * np.ptp(want)
