"""Squeeze, Unsqueeze and Transpose mapped onto the existing float IR by the frontend: Squeeze,
Unsqueeze and a Transpose of unit axes become Reshapes, any other Transpose a Permute."""

import numpy as np
from onnx import helper

from hwonnx.frontend import load_model
from spec_helpers import check_against_ort, make_model, rand


def check(model, **load_args):
    """Load ``model``, compare evaluate_float with onnxruntime, return the graph."""
    return check_against_ort(model, seed=5, rtol=1e-4, atol=1e-5, **load_args)


# Squeeze, Unsqueeze, Transpose ----------------------------------------------------------------

def test_squeeze_and_unsqueeze_become_reshapes():
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["g"], name="gap"),
             helper.make_node("Squeeze", ["g", "axes"], ["s"], name="squeeze"),
             helper.make_node("Gemm", ["s", "w"], ["d"], name="fc"),
             helper.make_node("Unsqueeze", ["d", "axes"], ["y"], name="unsqueeze")]
    model = make_model(nodes, {"x": [1, 3, 4, 4]}, {"y": [1, 5, 1, 1]},
                       {"axes": np.array([2, 3], np.int64), "w": rand(3, 5)})
    graph = check(model)
    assert [(n.op, n.attrs.get("shape")) for n in graph.nodes] == [
        ("AvgPool", None), ("Reshape", (1, 3)), ("Dense", None), ("Reshape", (1, 5, 1, 1))]


def test_transpose_of_unit_axes_becomes_reshape():
    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="t", perm=[2, 0, 1, 3]),
             helper.make_node("Relu", ["t"], ["y"], name="relu")]
    model = make_model(nodes, {"x": [1, 1, 3, 4]}, {"y": [3, 1, 1, 4]})
    graph = check(model)
    assert [(n.op, n.attrs.get("shape")) for n in graph.nodes] == [
        ("Reshape", (3, 1, 1, 4)), ("Relu", None)]


def test_transpose_of_non_unit_axes_is_a_permute():
    # Between two Relus (at the start or the end of the graph it would be a host step,
    # tests/host_steps/test_host_fallback.py): a Permute the array copies
    # (tests/passes/test_fold_transpose.py).
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Transpose", ["r"], ["t"], name="nhwc", perm=[0, 2, 3, 1]),
             helper.make_node("Relu", ["t"], ["y"], name="relu2")]
    model = make_model(nodes, {"x": [1, 3, 4, 4]}, {"y": [1, 4, 4, 3]})
    graph = load_model(model)
    assert [(n.op, n.attrs.get("perm")) for n in graph.nodes] == [
        ("Relu", None), ("Permute", (0, 2, 3, 1))]
    assert graph.nodes[1].attrs["relu"]                  # the second Relu, fused
