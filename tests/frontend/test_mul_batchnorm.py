"""Run-time Mul by a constant and standalone BatchNormalization mapped onto the existing float
IR by the frontend and the batchnorm-to-conv pass: a depthwise 1x1 Conv (4-D input) or a
diagonal Dense (``[1, C]`` input), fused with what follows; a Mul the array cannot map is a host
step, a Mul of two run-time values the element-wise engine's."""

import numpy as np
import pytest
from onnx import helper

from hwonnx.frontend import load_model
from spec_helpers import check_against_ort, make_model, rand

CONV_ATTRS = {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1), "relu": False,
              "act_max": None}


def check(model, **load_args):
    """Load ``model``, compare evaluate_float with onnxruntime, return the graph."""
    return check_against_ort(model, seed=5, rtol=1e-4, atol=1e-5, **load_args)


def ops(graph):
    return [n.op for n in graph.nodes]


def positive(*shape, seed=0):
    return (np.abs(rand(*shape, seed=seed)) + 0.5).astype(np.float32)


# Mul ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(3, 1, 1), (1, 3, 1, 1), (), (1,)],
                         ids=["C11", "1C11", "scalar", "one"])
@pytest.mark.parametrize("constant_first", [False, True])
def test_mul_4d_becomes_depthwise_conv(shape, constant_first):
    c = rand(*shape, seed=1) if shape else np.float32(1.7)
    inputs = ["c", "x"] if constant_first else ["x", "c"]
    model = make_model([helper.make_node("Mul", inputs, ["y"], name="scale")],
                       {"x": [1, 3, 4, 5]}, {"y": [1, 3, 4, 5]}, {"c": c})
    graph = check(model)
    (node,) = graph.nodes
    assert (node.op, node.name, node.outputs) == ("Conv", "scale", ("y",))
    assert dict(node.attrs) == {**CONV_ATTRS, "group": 3}
    assert len(node.inputs) == 2 and node.inputs[0] == "x"
    weight = graph.constants[node.inputs[1]]
    assert weight.shape == (3, 1, 1, 1)
    np.testing.assert_array_equal(weight.reshape(-1),
                                  np.broadcast_to(np.asarray(c).reshape(-1), (3,)))


@pytest.mark.parametrize("shape", [(6,), (1, 6), ()], ids=["K", "1K", "scalar"])
def test_mul_2d_becomes_diagonal_dense(shape):
    c = rand(*shape, seed=2) if shape else np.float32(-0.5)
    model = make_model([helper.make_node("Mul", ["x", "c"], ["y"], name="scale")],
                       {"x": [1, 6]}, {"y": [1, 6]}, {"c": c})
    graph = check(model)
    (node,) = graph.nodes
    assert (node.op, dict(node.attrs), len(node.inputs)) == (
        "Dense", {"relu": False, "act_max": None}, 2)
    np.testing.assert_array_equal(graph.constants[node.inputs[1]],
                                  np.diag(np.broadcast_to(np.asarray(c).reshape(-1), (6,))))


def test_mul_then_add_relu_fuses_into_one_conv():
    model = make_model([helper.make_node("Mul", ["x", "c"], ["m"], name="scale"),
                        helper.make_node("Add", ["m", "k"], ["a"], name="shift"),
                        helper.make_node("Relu", ["a"], ["y"], name="relu")],
                       {"x": [1, 4, 3, 3]}, {"y": [1, 4, 3, 3]},
                       {"c": rand(4, 1, 1, seed=1), "k": rand(1, 4, 1, 1, seed=2)})
    graph = check(model)
    (node,) = graph.nodes
    assert (node.op, node.attrs["relu"], node.attrs["group"], len(node.inputs), node.outputs) \
        == ("Conv", True, 4, 3, ("y",))


def test_mul_then_clip_fuses_on_dense():
    model = make_model([helper.make_node("Mul", ["x", "c"], ["m"], name="scale"),
                        helper.make_node("Clip", ["m", "lo", "hi"], ["y"], name="relu6")],
                       {"x": [1, 5]}, {"y": [1, 5]},
                       {"c": rand(5, seed=1), "lo": np.float32(0), "hi": np.float32(0.5)})
    graph = check(model)
    assert [(n.op, n.attrs["relu"], n.attrs["act_max"]) for n in graph.nodes] == [
        ("Dense", True, 0.5)]


def test_conv_bn_still_folds_after_mul_conv():
    model = make_model([helper.make_node("Mul", ["x", "c"], ["m"], name="scale"),
                        helper.make_node("BatchNormalization", ["m", "s", "b", "mu", "v"], ["y"],
                                         name="bn")],
                       {"x": [1, 3, 4, 4]}, {"y": [1, 3, 4, 4]},
                       {"c": rand(3, 1, 1, seed=1), "s": rand(3, seed=2), "b": rand(3, seed=3),
                        "mu": rand(3, seed=4), "v": positive(3, seed=5)})
    graph = check(model)
    assert ops(graph) == ["Conv"] and len(graph.nodes[0].inputs) == 3


def test_mul_by_spatial_constant_is_a_host_step():
    # After a Relu it is no leading chain: before, refused as a form the array cannot map;
    # now a host step between accelerator segments (tests/host_steps/test_segments.py runs one).
    model = make_model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                        helper.make_node("Mul", ["r", "c"], ["y"], name="mask")],
                       {"x": [1, 2, 3, 3]}, {"y": [1, 2, 3, 3]}, {"c": rand(1, 1, 3, 3)})
    graph = load_model(model)
    assert graph.meta["host_steps"]["mask"] == {"at": "middle", "why": (
        "Mul has no hardware mapping (a constant of shape [1, 1, 3, 3] is neither a scalar nor "
        "per channel); between accelerator segments: the host reads its input back and writes "
        "its result, quantized, into the next segment")}


def test_mul_of_two_runtime_values_maps_to_the_element_wise_engine():
    """(Refused before the element-wise engine; tests/operators/test_eltwise.py has the rest.)"""
    model = make_model([helper.make_node("Mul", ["a", "b"], ["y"], name="gate")],
                       {"a": [1, 4], "b": [1, 4]}, {"y": [1, 4]})
    graph = load_model(model)
    assert [(n.op, n.inputs, n.attrs["kind"]) for n in graph.nodes] == [
        ("Eltwise", ("a", "b"), "mul")]


# BatchNormalization ----------------------------------------------------------------------------

def bn_model(shape, after="Relu"):
    c = shape[1]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="pre"),
             helper.make_node("BatchNormalization", ["r", "s", "b", "mu", "v"], ["n"], name="bn",
                              epsilon=1e-3),
             helper.make_node(after, ["n"], ["y"], name="post")]
    return make_model(nodes, {"x": list(shape)}, {"y": list(shape)},
                      {"s": rand(c, seed=2), "b": rand(c, seed=3), "mu": rand(c, seed=4),
                       "v": positive(c, seed=5)})


def test_standalone_batchnorm_4d_becomes_depthwise_conv_with_fused_relu():
    graph = check(bn_model((1, 3, 4, 4)))
    assert ops(graph) == ["Relu", "Conv"]
    node = graph.nodes[1]
    assert (node.name, node.inputs[0], node.outputs) == ("bn", "r", ("y",))
    assert dict(node.attrs) == {**CONV_ATTRS, "group": 3, "relu": True}
    assert graph.constants[node.inputs[1]].shape == (3, 1, 1, 1)
    assert graph.constants[node.inputs[2]].shape == (3,)


def test_standalone_batchnorm_2d_becomes_diagonal_dense():
    graph = check(bn_model((1, 5), after="Identity"))
    assert ops(graph) == ["Relu", "Dense"]
    node = graph.nodes[1]
    weight = graph.constants[node.inputs[1]]
    assert weight.shape == (5, 5) and np.count_nonzero(weight - np.diag(np.diag(weight))) == 0
    assert (dict(node.attrs), node.outputs) == ({"relu": False, "act_max": None}, ("y",))


def test_batchnorm_on_graph_input_becomes_conv():
    model = make_model([helper.make_node("BatchNormalization", ["x", "s", "b", "mu", "v"], ["y"],
                                         name="bn")],
                       {"x": [1, 2, 3, 3]}, {"y": [1, 2, 3, 3]},
                       {"s": rand(2, seed=2), "b": rand(2, seed=3), "mu": rand(2, seed=4),
                        "v": positive(2, seed=5)})
    assert ops(check(model)) == ["Conv"]
