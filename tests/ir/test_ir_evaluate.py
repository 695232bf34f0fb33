"""The float32 reference evaluator of the float IR vocabulary."""

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from hwonnx.ir.evaluate import FLOAT_OPS, evaluate_float
from hwonnx.ir.graph import Graph, Node, TensorType

RNG = np.random.default_rng(3)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def t(*shape):
    return TensorType("float32", shape)


def small_cnn():
    """Conv(stride 2, asymmetric pads, dilation) -> BatchNorm -> Relu -> Flatten -> Dense ->
    Add -> Reshape -> Identity."""
    nodes = [
        Node("conv", "Conv", ("x", "w", "b"), ("c",),
             {"strides": (2, 1), "pads": (1, 0, 2, 1), "dilations": (1, 2), "relu": True}),
        Node("bn", "BatchNorm", ("c", "s", "bb", "m", "v"), ("n",), {"epsilon": 1e-5}),
        Node("relu", "Relu", ("n",), ("r",)),
        Node("flat", "Flatten", ("r",), ("f",), {"axis": 1}),
        Node("fc", "Dense", ("f", "w2", "b2"), ("d",), {"relu": False}),
        Node("add", "Add", ("d", "k"), ("a",)),
        Node("reshape", "Reshape", ("a",), ("rs",), {"shape": (1, 2, 3)}),
        Node("copy", "Identity", ("rs",), ("y",)),
    ]
    constants = {"w": rand(4, 2, 3, 3), "b": rand(4), "s": rand(4), "bb": rand(4),
                 "m": rand(4), "v": np.abs(rand(4)) + 0.5, "w2": rand(48, 6), "b2": rand(6),
                 "k": rand(6)}
    types = {"x": t(1, 2, 7, 6), "c": t(1, 4, 4, 3), "n": t(1, 4, 4, 3), "r": t(1, 4, 4, 3),
             "f": t(1, 48), "d": t(1, 6), "a": t(1, 6), "rs": t(1, 2, 3), "y": t(1, 2, 3)}
    types.update({k: t(*v.shape) for k, v in constants.items()})
    return Graph(nodes, ("x",), ("y",), types, constants)


def onnx_reference(x, constants):
    """The same network in ONNX, run by onnx's reference evaluator."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c0"], strides=[2, 1], pads=[1, 0, 2, 1],
                         dilations=[1, 2]),
        helper.make_node("Relu", ["c0"], ["c"]),
        helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"]),
        helper.make_node("Gemm", ["f", "w2", "b2"], ["d"]),
        helper.make_node("Add", ["d", "k"], ["a"]),
        helper.make_node("Reshape", ["a", "shape"], ["y"]),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in constants.items()]
    inits.append(numpy_helper.from_array(np.array([-1, 2, 3], np.int64), "shape"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ReferenceEvaluator(model).run(None, {"x": x})[0]


def test_matches_onnx_reference():
    graph = small_cnn()
    x = rand(1, 2, 7, 6)
    got = evaluate_float(graph, {"x": x})
    assert set(got) == {"y"} and got["y"].dtype == np.float32
    np.testing.assert_allclose(got["y"], onnx_reference(x, dict(graph.constants)),
                               rtol=1e-4, atol=1e-5)


def test_batched_feeds_match_single_samples():
    graph = small_cnn()
    x = rand(5, 2, 7, 6)
    batched = evaluate_float(graph, {"x": x})["y"]
    assert batched.shape == (5, 2, 3)
    for i in range(5):
        single = evaluate_float(graph, {"x": x[i:i + 1]})["y"]
        np.testing.assert_allclose(batched[i:i + 1], single, rtol=1e-5, atol=1e-6)


def test_keep_all_returns_every_value():
    graph = small_cnn()
    values = evaluate_float(graph, {"x": rand(2, 2, 7, 6)}, keep_all=True)
    assert set(values) == set(graph.types)
    assert values["c"].shape == (2, 4, 4, 3) and values["f"].shape == (2, 48)
    assert (values["c"] >= 0).all()                      # the Conv's fused ReLU


def test_add_broadcasts():
    graph = Graph([Node("add", "Add", ("a", "b"), ("y",))], ("a", "b"), ("y",),
                  {"a": t(1, 3, 2, 2), "b": t(1, 3, 1, 1), "y": t(1, 3, 2, 2)})
    a, b = rand(1, 3, 2, 2), rand(1, 3, 1, 1)
    np.testing.assert_array_equal(evaluate_float(graph, {"a": a, "b": b})["y"], a + b)


def test_unknown_op_is_a_bug():
    graph = Graph([Node("q", "QConv", ("x",), ("y",))], ("x",), ("y",),
                  {"x": t(1, 2), "y": t(1, 2)})
    with pytest.raises(NotImplementedError,
                       match=r"^No float reference for IR op QConv \(node 'q'\)$"):
        evaluate_float(graph, {"x": rand(1, 2)})
    assert "QConv" not in FLOAT_OPS


def test_feeds_are_checked():
    graph = small_cnn()
    with pytest.raises(ValueError, match=r"^No value fed for graph input 'x'$"):
        evaluate_float(graph, {})
    with pytest.raises(ValueError, match="^" + re.escape(
            "Feed for graph input 'x' must have shape [1, 2, 7, 6] (any leading size), not "
            "[1, 2, 7, 7]") + "$"):
        evaluate_float(graph, {"x": rand(1, 2, 7, 7)})


def test_batched_reshape_needs_leading_one():
    graph = Graph([Node("r", "Reshape", ("x",), ("y",), {"shape": (2, 2)})], ("x",), ("y",),
                  {"x": t(1, 4), "y": t(2, 2)})
    with pytest.raises(ValueError, match=r"^Cannot evaluate a batch of 3 through a reshape to "
                       r"\[2, 2\], whose leading dimension is not 1$"):
        evaluate_float(graph, {"x": rand(3, 4)})
