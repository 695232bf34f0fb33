"""Float graph passes: structure after each pass, and golden equivalence before and after."""

import re
from dataclasses import dataclass, replace

import numpy as np
import pytest

from hwonnx.ir.evaluate import evaluate_float
from hwonnx.ir.graph import Graph, IRVerificationError, Node, TensorType
from hwonnx.passes import (
    FLOAT_PIPELINE, FoldBatchNorm, FuseBias, FuseRelu, PassContext, RemoveIdentity,
    run_pipeline,
)

RNG = np.random.default_rng(7)
CTX = PassContext()


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def make_graph(nodes, inputs, outputs, constants=None, shapes=None):
    """``inputs`` and ``shapes`` map value names to shapes; constants carry their own."""
    constants = constants or {}
    types = {name: TensorType("float32", tuple(shape))
             for name, shape in {**inputs, **(shapes or {})}.items()}
    types.update({name: TensorType("float32", value.shape) for name, value in constants.items()})
    graph = Graph(nodes, tuple(inputs), outputs, types, constants)
    graph.verify()
    return graph


def assert_equivalent(before, after):
    feeds = {name: rand(*before.types[name].shape) for name in before.inputs}
    expected, got = evaluate_float(before, feeds), evaluate_float(after, feeds)
    assert before.outputs == after.outputs
    for name in before.outputs:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5)


def conv(name, x, w, out, bias=None, relu=False):
    inputs = (x, w, bias) if bias else (x, w)
    return Node(name, "Conv", inputs, (out,), {"strides": (1, 1), "pads": (1, 1, 1, 1),
                                              "dilations": (1, 1), "relu": relu})


def conv_bn_graph(extra_consumer=False, relu=False):
    nodes = [conv("conv", "x", "w", "c", relu=relu),
             Node("bn", "BatchNorm", ("c", "s", "b", "m", "v"), ("y",), {"epsilon": 1e-5})]
    outputs = ("y",)
    shapes = {"c": (1, 4, 5, 5), "y": (1, 4, 5, 5)}
    if extra_consumer:
        nodes.append(Node("tap", "Relu", ("c",), ("t",)))
        outputs, shapes["t"] = ("y", "t"), (1, 4, 5, 5)
    return make_graph(nodes, {"x": (1, 3, 5, 5)}, outputs,
                      {"w": rand(4, 3, 3, 3), "s": rand(4), "b": rand(4), "m": rand(4),
                       "v": np.abs(rand(4)) + 0.5}, shapes)


# remove-identity --------------------------------------------------------------------------------

def test_remove_identity_keeps_graph_output_names():
    graph = make_graph([Node("r", "Relu", ("x",), ("a",)),
                        Node("i1", "Identity", ("a",), ("b",)),
                        Node("i2", "Identity", ("b",), ("y",))],
                       {"x": (1, 4)}, ("y",), shapes={"a": (1, 4), "b": (1, 4), "y": (1, 4)})
    new = RemoveIdentity()(graph, CTX)
    assert [(n.op, n.inputs, n.outputs) for n in new.nodes] == [("Relu", ("x",), ("y",))]
    assert set(new.types) == {"x", "y"}
    assert_equivalent(graph, new)
    assert len(graph.nodes) == 3                         # the input graph is untouched


def test_remove_identity_renames_consumers():
    graph = make_graph([Node("i", "Identity", ("x",), ("a",)),
                        Node("r", "Relu", ("a",), ("y",))],
                       {"x": (1, 4)}, ("y",), shapes={"a": (1, 4), "y": (1, 4)})
    new = RemoveIdentity()(graph, CTX)
    assert [(n.op, n.inputs, n.outputs) for n in new.nodes] == [("Relu", ("x",), ("y",))]
    assert_equivalent(graph, new)


@pytest.mark.parametrize("outputs", [("y",), ("a", "y")])
def test_remove_identity_keeps_copies_of_inputs_and_outputs(outputs):
    nodes = [Node("r", "Relu", ("x",), ("a",)), Node("i", "Identity", ("a",), ("y",))]
    if outputs == ("y",):
        nodes = [Node("i", "Identity", ("x",), ("y",))]
    graph = make_graph(nodes, {"x": (1, 4)}, outputs, shapes={"a": (1, 4), "y": (1, 4)})
    assert RemoveIdentity()(graph, CTX) is graph


# fold-batchnorm ---------------------------------------------------------------------------------

def test_fold_batchnorm_into_conv():
    graph = conv_bn_graph()
    new = FoldBatchNorm()(graph, CTX)
    (node,) = new.nodes
    assert node.op == "Conv" and node.name == "conv" and node.outputs == ("y",)
    assert len(node.inputs) == 3 and set(new.constants) == set(node.inputs[1:])
    assert "c" not in new.types
    assert_equivalent(graph, new)


def test_fold_batchnorm_into_dense_with_bias():
    graph = make_graph([Node("fc", "Dense", ("x", "w", "bias"), ("d",), {"relu": False}),
                        Node("bn", "BatchNorm", ("d", "s", "b", "m", "v"), ("y",),
                             {"epsilon": 1e-3})],
                       {"x": (1, 5)}, ("y",),
                       {"w": rand(5, 3), "bias": rand(3), "s": rand(3), "b": rand(3),
                        "m": rand(3), "v": np.abs(rand(3)) + 0.5},
                       {"d": (1, 3), "y": (1, 3)})
    new = FoldBatchNorm()(graph, CTX)
    assert [n.op for n in new.nodes] == ["Dense"]
    assert_equivalent(graph, new)


@pytest.mark.parametrize("kwargs", [{"extra_consumer": True}, {"relu": True}])
def test_fold_batchnorm_leaves_unfoldable(kwargs):
    graph = conv_bn_graph(**kwargs)
    assert FoldBatchNorm()(graph, CTX) is graph


# fuse-bias --------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 1, 1), (1, 4, 1, 1)])
def test_fuse_bias_into_conv_adds_to_existing_bias(shape):
    graph = make_graph([conv("conv", "x", "w", "c", bias="b"),
                        Node("add", "Add", ("c", "k"), ("y",))],
                       {"x": (1, 2, 4, 4)}, ("y",), {"w": rand(4, 2, 3, 3), "b": rand(4),
                                                     "k": rand(*shape)},
                       {"c": (1, 4, 4, 4), "y": (1, 4, 4, 4)})
    new = FuseBias()(graph, CTX)
    (node,) = new.nodes
    assert node.op == "Conv" and node.outputs == ("y",) and new.constants[node.inputs[2]].shape \
        == (4,)
    assert_equivalent(graph, new)


@pytest.mark.parametrize("shape", [(3,), (1, 3)])
def test_fuse_bias_creates_dense_bias(shape):
    graph = make_graph([Node("fc", "Dense", ("x", "w"), ("d",), {"relu": False}),
                        Node("add", "Add", ("k", "d"), ("y",))],
                       {"x": (1, 5)}, ("y",), {"w": rand(5, 3), "k": rand(*shape)},
                       {"d": (1, 3), "y": (1, 3)})
    new = FuseBias()(graph, CTX)
    assert [(n.op, len(n.inputs), n.outputs) for n in new.nodes] == [("Dense", 3, ("y",))]
    assert_equivalent(graph, new)


def test_fuse_bias_leaves_non_channel_constants():
    graph = make_graph([conv("conv", "x", "w", "c"), Node("add", "Add", ("c", "k"), ("y",))],
                       {"x": (1, 2, 4, 4)}, ("y",), {"w": rand(4, 2, 3, 3), "k": rand(1, 1, 4, 4)},
                       {"c": (1, 4, 4, 4), "y": (1, 4, 4, 4)})
    assert FuseBias()(graph, CTX) is graph


# fuse-relu --------------------------------------------------------------------------------------

def test_fuse_relu():
    graph = make_graph([conv("conv", "x", "w", "c"), Node("relu", "Relu", ("c",), ("y",))],
                       {"x": (1, 2, 4, 4)}, ("y",), {"w": rand(4, 2, 3, 3)},
                       {"c": (1, 4, 4, 4), "y": (1, 4, 4, 4)})
    new = FuseRelu()(graph, CTX)
    (node,) = new.nodes
    assert node.op == "Conv" and node.attrs["relu"] is True and node.outputs == ("y",)
    assert graph.nodes[0].attrs["relu"] is False         # the input graph is untouched
    assert_equivalent(graph, new)


@pytest.mark.parametrize("outputs", [("y", "c"), ("y", "z")])
def test_fuse_relu_needs_a_single_consumer(outputs):
    nodes = [conv("conv", "x", "w", "c"), Node("relu", "Relu", ("c",), ("y",))]
    if "z" in outputs:
        nodes.append(Node("other", "Add", ("c", "x"), ("z",)))
    graph = make_graph(nodes, {"x": (1, 4, 4, 4)}, outputs, {"w": rand(4, 4, 3, 3)},
                       {"c": (1, 4, 4, 4), "y": (1, 4, 4, 4), "z": (1, 4, 4, 4)})
    assert FuseRelu()(graph, CTX) is graph


# pipeline ---------------------------------------------------------------------------------------

def test_float_pipeline_order():
    assert [p.name for p in FLOAT_PIPELINE] == [
        "fold-transpose", "remove-identity", "channel-shuffle", "fold-pad", "fold-batchnorm",
        "batchnorm-to-conv", "fuse-bias", "fold-scale", "fuse-relu", "fuse-clip"]


def bn_add_relu_graph():
    graph = conv_bn_graph()
    nodes = (*graph.nodes[:1], replace(graph.nodes[1], outputs=("n",)),
             Node("add", "Add", ("n", "k"), ("a",)), Node("relu", "Relu", ("a",), ("y",)))
    types = {**graph.types, "n": graph.types["y"], "a": graph.types["y"],
             "k": TensorType("float32", (1, 4, 1, 1))}
    return replace(graph, nodes=nodes, types=types,
                   constants={**graph.constants, "k": rand(1, 4, 1, 1)})


def test_pipeline_fuses_conv_bn_add_relu_and_dumps(tmp_path):
    graph = bn_add_relu_graph()
    new = run_pipeline(graph, FLOAT_PIPELINE, PassContext(dump_dir=tmp_path / "ir"))
    assert [(n.op, n.attrs["relu"], n.outputs) for n in new.nodes] == [("Conv", True, ("y",))]
    assert_equivalent(graph, new)
    assert sorted(p.name for p in (tmp_path / "ir").iterdir()) == [
        "00-input.ir.txt", "01-fold-transpose.ir.txt", "02-remove-identity.ir.txt",
        "03-channel-shuffle.ir.txt", "04-fold-pad.ir.txt", "05-fold-batchnorm.ir.txt",
        "06-batchnorm-to-conv.ir.txt", "07-fuse-bias.ir.txt", "08-fold-scale.ir.txt",
        "09-fuse-relu.ir.txt", "10-fuse-clip.ir.txt"]
    assert (tmp_path / "ir" / "10-fuse-clip.ir.txt").read_text() == repr(new) + "\n"


def test_pipeline_skips_passes():
    graph = bn_add_relu_graph()
    new = run_pipeline(graph, FLOAT_PIPELINE, PassContext(skip=frozenset({"fuse-bias"})))
    assert [(n.op, n.attrs["relu"]) for n in new.nodes] == [("Conv", False), ("Add", True)]
    assert_equivalent(graph, new)


@dataclass(frozen=True)
class BreakGraph:
    name: str = "break-graph"

    def __call__(self, graph, ctx):
        return replace(graph, nodes=(replace(graph.nodes[0], inputs=("nowhere",)),))


def test_pipeline_names_the_pass_that_breaks_the_graph():
    graph = make_graph([Node("r", "Relu", ("x",), ("y",))], {"x": (1, 4)}, ("y",),
                       shapes={"y": (1, 4)})
    with pytest.raises(IRVerificationError, match="^" + re.escape(
            "After pass 'break-graph': Node 'r' (Relu) reads 'nowhere' before it is defined")
            + "$"):
        run_pipeline(graph, [BreakGraph()], CTX)
