"""Operators of real CNNs (the MLPerf Tiny models): grouped / depthwise Conv, AveragePool,
GlobalAveragePool, residual Add, Clip / Relu6 and a final Softmax, through ``load_model`` and
``evaluate_float``, compared with onnxruntime."""

import collections
import functools

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper

from hwonnx.errors import ModelError, UnsupportedOperatorError
from hwonnx.frontend import load_model
from hwonnx.ir.evaluate import evaluate_float
from hwonnx.ir.graph import Graph, Node, TensorType
from hwonnx.passes import FuseClip, FuseRelu, PassContext
from hwonnx.zoo import MLPERF_TINY, random_inputs

from helpers import raises
from spec_helpers import SUPPORTED, make_model, rand

RTOL, ATOL = 1e-4, 1e-5


def ort_run(model: onnx.ModelProto, feeds: "dict[str, np.ndarray]", extra=()):
    """Run ``model`` on onnxruntime one sample at a time (the models have batch 1), with the
    intermediate values ``extra`` added as graph outputs; return {name: stacked values}."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    model.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in extra)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    count = len(next(iter(feeds.values())))
    runs = [session.run(None, {k: v[i:i + 1] for k, v in feeds.items()}) for i in range(count)]
    return {name: np.concatenate([run[j] for run in runs]) for j, name in enumerate(names)}


def check(model, rtol=RTOL, atol=ATOL, samples=3):
    """Load ``model``, evaluate a batch of random inputs and compare every output with
    onnxruntime; return the float graph."""
    graph = load_model(model)
    rng = np.random.default_rng(7)
    feeds = {name: rng.standard_normal((samples, *graph.types[name].shape[1:]))
             .astype(np.float32) for name in graph.inputs}
    got = evaluate_float(graph, feeds)
    expected = ort_run(model, feeds)
    assert list(got) == list(graph.outputs)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], expected[name], rtol=rtol, atol=atol)
    return graph


def conv_node(x, w, y, name, **attrs):
    return helper.make_node("Conv", [x, w, f"{w}_b"], [y], name=name, **attrs)


# Grouped and depthwise convolution --------------------------------------------------------------

def test_depthwise_conv_stride_2_with_pads():
    model = make_model([conv_node("x", "w", "y", "dw", group=6, strides=[2, 2],
                                  pads=[1, 0, 1, 1], kernel_shape=[3, 3])],
                       {"x": [1, 6, 9, 8]}, {"y": [1, 6, 5, 4]},
                       {"w": rand(6, 1, 3, 3), "w_b": rand(6)})
    (node,) = check(model).nodes
    assert node.op == "Conv" and dict(node.attrs) == {
        "strides": (2, 2), "pads": (1, 0, 1, 1), "dilations": (1, 1), "group": 6,
        "relu": False, "act_max": None}


def test_grouped_conv_group_2():
    model = make_model([conv_node("x", "w", "y", "gc", group=2, pads=[1, 1, 1, 1])],
                       {"x": [1, 6, 7, 7]}, {"y": [1, 4, 7, 7]},
                       {"w": rand(4, 3, 3, 3), "w_b": rand(4)})
    (node,) = check(model).nodes
    assert node.attrs["group"] == 2


def test_depthwise_conv_with_channel_multiplier_and_same_padding():
    model = make_model([conv_node("x", "w", "y", "dw", group=3, strides=[2, 1],
                                  auto_pad="SAME_UPPER")],
                       {"x": [1, 3, 8, 9]}, {"y": [1, 6, 4, 9]},
                       {"w": rand(6, 1, 3, 3), "w_b": rand(6)})
    check(model)
    model = make_model([conv_node("x", "w", "y", "dw", group=3, dilations=[2, 1],
                                  pads=[2, 1, 1, 0])],
                       {"x": [1, 3, 8, 9]}, {"y": [1, 6, 7, 8]},
                       {"w": rand(6, 1, 3, 3), "w_b": rand(6)})
    check(model)


def test_batchnorm_folds_into_a_depthwise_conv():
    model = make_model([conv_node("x", "w", "c", "dw", group=4, pads=[1, 1, 1, 1]),
                        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"],
                                         name="bn"),
                        helper.make_node("Relu", ["n"], ["y"], name="act")],
                       {"x": [1, 4, 6, 6]}, {"y": [1, 4, 6, 6]},
                       {"w": rand(4, 1, 3, 3), "w_b": rand(4), "s": rand(4), "b": rand(4),
                        "m": rand(4), "v": np.abs(rand(4)) + 0.5})
    (node,) = check(model).nodes
    assert (node.op, node.attrs["group"], node.attrs["relu"]) == ("Conv", 4, True)


# Average pooling ---------------------------------------------------------------------------------

@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool_with_pads(count_include_pad):
    model = make_model([helper.make_node("AveragePool", ["x"], ["y"], name="pool",
                                         kernel_shape=[3, 2], strides=[2, 2],
                                         pads=[1, 0, 2, 1], count_include_pad=count_include_pad)],
                       {"x": [1, 3, 7, 6]}, {"y": [1, 3, 4, 3]})
    (node,) = check(model).nodes
    assert node.op == "AvgPool" and dict(node.attrs) == {
        "kernel": (3, 2), "strides": (2, 2), "pads": (1, 0, 2, 1),
        "count_include_pad": bool(count_include_pad), "relu": False, "act_max": None}


def test_average_pool_same_padding_excludes_the_pads():
    model = make_model([helper.make_node("AveragePool", ["x"], ["y"], name="pool",
                                         kernel_shape=[3, 3], strides=[2, 2],
                                         auto_pad="SAME_LOWER")],
                       {"x": [1, 2, 7, 6]}, {"y": [1, 2, 4, 3]})
    (node,) = check(model).nodes
    assert node.attrs["pads"] == (1, 1, 1, 0) and node.attrs["count_include_pad"] is False


def test_global_average_pool():
    model = make_model([helper.make_node("GlobalAveragePool", ["x"], ["y"], name="gap")],
                       {"x": [1, 5, 4, 7]}, {"y": [1, 5, 1, 1]})
    (node,) = check(model).nodes
    assert node.op == "AvgPool" and dict(node.attrs) == {
        "kernel": (4, 7), "strides": (1, 1), "pads": (0, 0, 0, 0), "count_include_pad": True,
        "relu": False, "act_max": None}


def test_average_pool_ceil_mode_is_refused():
    model = make_model([helper.make_node("AveragePool", ["x"], ["y"], name="pool",
                                         kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)],
                       {"x": [1, 1, 5, 5]}, {"y": [1, 1, 3, 3]})
    with raises(ModelError, "AveragePool 'pool' has ceil_mode=1; only ceil_mode=0 (output size "
                            "rounded down) is supported"):
        load_model(model)


def test_average_pool_dilations_are_refused():
    model = make_model([helper.make_node("AveragePool", ["x"], ["y"], name="pool",
                                         kernel_shape=[2, 2], dilations=[2, 2])],
                       {"x": [1, 1, 5, 5]}, {"y": [1, 1, 3, 3]}, opset=19)
    with raises(ModelError, "AveragePool 'pool' has dilations [2, 2]; only dilations [1, 1] are "
                            "supported"):
        load_model(model)


def test_average_pool_pads_as_large_as_the_kernel_are_refused():
    model = make_model([helper.make_node("AveragePool", ["x"], ["y"], name="pool",
                                         kernel_shape=[2, 3], pads=[1, 1, 0, 3])],
                       {"x": [1, 1, 5, 5]}, {"y": [1, 1, 5, 7]})
    with raises(ModelError, "AveragePool 'pool' has pads [1, 1, 0, 3]; each must be smaller "
                            "than the kernel [2, 3] (a window must not lie entirely in the "
                            "padding)"):
        load_model(model)


# Residual Add, Clip ------------------------------------------------------------------------------

def test_residual_add_keeps_add_and_fuses_relu():
    model = make_model([conv_node("x", "w1", "a", "conv1", pads=[1, 1, 1, 1]),
                        helper.make_node("Relu", ["a"], ["r"], name="act1"),
                        conv_node("r", "w2", "c", "conv2", pads=[1, 1, 1, 1]),
                        helper.make_node("Add", ["r", "c"], ["s"], name="add"),
                        helper.make_node("Relu", ["s"], ["y"], name="act2")],
                       {"x": [1, 3, 6, 6]}, {"y": [1, 3, 6, 6]},
                       {"w1": rand(3, 3, 3, 3), "w1_b": rand(3), "w2": rand(3, 3, 3, 3),
                        "w2_b": rand(3)})
    graph = check(model)
    assert [(n.op, n.attrs["relu"]) for n in graph.nodes] == [
        ("Conv", True), ("Conv", False), ("Add", True)]
    assert graph.nodes[2].inputs == ("r", "c") and graph.nodes[2].outputs == ("y",)
    assert graph.nodes[2].attrs["act_max"] is None


def clip_model(low, high, opset=13, producer="conv"):
    """``producer`` (a Conv, or the graph input itself) followed by Clip(low, high)."""
    nodes, inits, source = [], {}, "x"
    if producer == "conv":
        nodes.append(conv_node("x", "w", "c", "conv", pads=[1, 1, 1, 1]))
        inits = {"w": rand(3, 2, 3, 3), "w_b": rand(3)}
        source = "c"
    if opset >= 11:
        inputs = [source, "lo" if low is not None else "", "hi" if high is not None else ""]
        inits.update({k: np.float32(v) for k, v in (("lo", low), ("hi", high)) if v is not None})
        nodes.append(helper.make_node("Clip", inputs, ["y"], name="clip"))
    else:
        attrs = {k: v for k, v in (("min", low), ("max", high)) if v is not None}
        nodes.append(helper.make_node("Clip", [source], ["y"], name="clip", **attrs))
    shape = [1, 3, 5, 5] if producer == "conv" else [1, 2, 5, 5]
    return make_model(nodes, {"x": [1, 2, 5, 5]}, {"y": shape}, inits, opset=opset)


@pytest.mark.parametrize("opset", [10, 13])
def test_relu6_clip_fuses_into_relu_and_act_max(opset):
    (node,) = check(clip_model(0.0, 6.0, opset)).nodes
    assert (node.op, node.attrs["relu"], node.attrs["act_max"], node.outputs) == (
        "Conv", True, 6.0, ("y",))


@pytest.mark.parametrize("low", [None, -np.inf])
def test_clip_without_minimum_sets_only_act_max(low):
    (node,) = check(clip_model(low, 0.5)).nodes
    assert (node.attrs["relu"], node.attrs["act_max"]) == (False, 0.5)


def test_clip_without_maximum_is_a_relu():
    (node,) = check(clip_model(0.0, None)).nodes
    assert (node.attrs["relu"], node.attrs["act_max"]) == (True, None)


def test_clip_with_a_nonzero_minimum_is_refused_by_name():
    with raises(UnsupportedOperatorError,
                "1 unsupported node(s): node 'clip' Clip (domain 'ai.onnx', opset 13) (Clip "
                "'clip' has min=-1; only min 0 (a ReLU) or no minimum can be fused into the "
                "layer before it)") as info:
        load_model(clip_model(-1.0, 6.0))
    assert info.value.nodes == [("clip", "Clip", "", 13)]


def test_clip_after_a_graph_input_is_refused_by_name():
    with raises(UnsupportedOperatorError,
                "1 unsupported node(s): node 'clip' Clip (domain 'ai.onnx', opset 13) (Clip "
                "'clip' does not follow a Conv, Gemm, MatMul, Add, Concat, AveragePool, "
                "GlobalAveragePool, MaxPool or GlobalMaxPool whose output only it reads, so it "
                "cannot be fused)"):
        load_model(clip_model(0.0, 6.0, producer=None))


def test_clip_with_a_runtime_bound_is_refused():
    model = make_model([helper.make_node("Clip", ["x", "lo"], ["y"], name="clip")],
                       {"x": [1, 4], "lo": []}, {"y": [1, 4]})
    with raises(UnsupportedOperatorError,
                "1 unsupported node(s): node 'clip' Clip (domain 'ai.onnx', opset 17) (Clip "
                "'clip' needs a constant min, but 'lo' is computed at run time); " + SUPPORTED):
        load_model(model)


def test_clip_after_dense_and_avgpool_and_add():
    model = make_model([helper.make_node("AveragePool", ["x"], ["p"], name="pool",
                                         kernel_shape=[2, 2]),
                        helper.make_node("Clip", ["p", "zero", "six"], ["q"], name="clip1"),
                        helper.make_node("Add", ["q", "k"], ["s"], name="add"),
                        helper.make_node("Clip", ["s", "", "six"], ["t"], name="clip2"),
                        helper.make_node("Flatten", ["t"], ["f"], name="flat"),
                        helper.make_node("Gemm", ["f", "g"], ["d"], name="fc"),
                        helper.make_node("Clip", ["d", "zero", "six"], ["y"], name="clip3")],
                       {"x": [1, 2, 3, 3]}, {"y": [1, 3]},
                       {"zero": np.float32(0), "six": np.float32(6) / 8,
                        "k": rand(1, 2, 2, 2), "g": rand(8, 3)})
    graph = check(model)
    assert [(n.op, n.attrs.get("relu"), n.attrs.get("act_max")) for n in graph.nodes] == [
        ("AvgPool", True, 0.75), ("Add", False, 0.75), ("Flatten", None, None),
        ("Dense", True, 0.75)]


# Softmax -----------------------------------------------------------------------------------------

def test_softmax_at_the_end():
    model = make_model([helper.make_node("Gemm", ["x", "w", "b"], ["d"], name="fc"),
                        helper.make_node("Softmax", ["d"], ["y"], name="probs")],
                       {"x": [1, 5]}, {"y": [1, 4]}, {"w": rand(5, 4), "b": rand(4)})
    graph = check(model)
    assert [n.op for n in graph.nodes] == ["Dense", "Softmax"]
    assert dict(graph.nodes[1].attrs) == {"axis": 1}


def test_softmax_followed_by_reshape_identity_and_softmax_on_inner_axis():
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                        helper.make_node("Softmax", ["c"], ["s"], name="probs", axis=-3),
                        helper.make_node("Identity", ["s"], ["i"], name="copy"),
                        helper.make_node("Reshape", ["i", "shape"], ["y"], name="reshape"),
                        helper.make_node("Softmax", ["s"], ["z"], name="again", axis=2)],
                       {"x": [1, 2, 4, 4]}, {"y": [1, 18], "z": [1, 2, 3, 3]},
                       {"w": rand(2, 2, 2, 2), "shape": np.array([1, -1], np.int64)})
    graph = check(model)
    assert [(n.op, n.attrs.get("axis")) for n in graph.nodes] == [
        ("Conv", None), ("Softmax", 1), ("Reshape", None), ("Softmax", 2)]


def test_opset_11_softmax_flattens_its_input():
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], name="probs", axis=1)],
                       {"x": [1, 2, 3]}, {"y": [1, 2, 3]}, opset=11)
    graph = check(model)
    assert [n.op for n in graph.nodes] == ["Flatten", "Softmax", "Reshape"]


def test_softmax_in_the_middle_is_a_host_step():
    # Before, refused as running on neither side; now the host runs it before the Gemm's
    # segment (tests/host_steps/test_segments.py runs such models).
    model = make_model([helper.make_node("Softmax", ["x"], ["s"], name="probs"),
                        helper.make_node("Identity", ["s"], ["i"], name="copy"),
                        helper.make_node("Gemm", ["i", "w"], ["y"], name="fc")],
                       {"x": [1, 3]}, {"y": [1, 2]}, {"w": rand(3, 2)})
    graph = load_model(model)
    assert graph.meta["host_steps"] == {"probs": {"at": "middle", "why": (
        "Softmax has no hardware mapping; between accelerator segments: the host reads its "
        "input back and writes its result, quantized, into the next segment")}}


def test_softmax_that_is_an_output_and_also_read_by_a_layer_is_a_host_step():
    model = make_model([helper.make_node("Softmax", ["x"], ["s"], name="probs"),
                        helper.make_node("Gemm", ["s", "w"], ["y"], name="fc")],
                       {"x": [1, 3]}, {"s": [1, 3], "y": [1, 2]}, {"w": rand(3, 2)})
    graph = load_model(model)
    assert graph.meta["host_steps"]["probs"]["at"] == "middle"
    assert graph.outputs == ("s", "y")


# Passes on hand-made graphs ----------------------------------------------------------------------

def layer_graph(act_max, op="Clip", attrs=None):
    t = TensorType("float32", (1, 4))
    nodes = [Node("fc", "Dense", ("x", "w"), ("d",), {"relu": False, "act_max": act_max}),
             Node("act", op, ("d",), ("y",), attrs or {})]
    return Graph(nodes, ("x",), ("y",), {"x": t, "w": TensorType("float32", (4, 4)),
                                         "d": t, "y": t}, {"w": rand(4, 4)})


def test_fuse_clip_keeps_the_lower_act_max():
    graph = layer_graph(3.0, attrs={"min": None, "max": 6.0})
    (node,) = FuseClip()(graph, PassContext()).nodes
    assert (node.attrs["relu"], node.attrs["act_max"], node.outputs) == (False, 3.0, ("y",))
    graph = layer_graph(8.0, attrs={"min": 0.0, "max": 6.0})
    (node,) = FuseClip()(graph, PassContext()).nodes
    assert (node.attrs["relu"], node.attrs["act_max"]) == (True, 6.0)


def test_fuse_relu_leaves_a_relu_after_a_negative_act_max():
    graph = layer_graph(-1.0, op="Relu")
    assert FuseRelu()(graph, PassContext()) is graph
    graph = layer_graph(2.0, op="Relu")
    (node,) = FuseRelu()(graph, PassContext()).nodes
    assert (node.attrs["relu"], node.attrs["act_max"]) == (True, 2.0)
    feeds = {"x": rand(5, 4)}
    np.testing.assert_array_equal(evaluate_float(graph, feeds)["y"],
                                  evaluate_float(FuseRelu()(graph, PassContext()), feeds)["y"])


def test_evaluate_softmax_on_axis_0_of_a_batch():
    t = TensorType("float32", (1, 3))
    graph = Graph([Node("s", "Softmax", ("x",), ("y",), {"axis": 0})], ("x",), ("y",),
                  {"x": t, "y": t})
    np.testing.assert_array_equal(evaluate_float(graph, {"x": rand(4, 3)})["y"],
                                  np.ones((4, 3), np.float32))


# MLPerf Tiny -------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def zoo_model(name: str) -> bytes:
    return MLPERF_TINY[name]().SerializeToString()


@functools.lru_cache(maxsize=None)
def zoo_graph(name: str):
    return load_model(onnx.load_from_string(zoo_model(name)))


@pytest.mark.parametrize("name", sorted(MLPERF_TINY))
def test_mlperf_tiny_matches_onnxruntime(name):
    model = onnx.load_from_string(zoo_model(name))
    graph = zoo_graph(name)
    feeds = {k: v.reshape(-1, *v.shape[2:]) for k, v in random_inputs(model, 2, 0).items()}
    # Compare the logits before a final Softmax too: probabilities hide small errors.
    extra = [n.inputs[0] for n in graph.nodes if n.op == "Softmax"]
    got = evaluate_float(graph, feeds, keep_all=True)
    expected = ort_run(model, feeds, extra)
    for value in (*graph.outputs, *extra):
        np.testing.assert_allclose(got[value], expected[value], rtol=1e-3, atol=1e-4)


EXPECTED = {  # (op, group > 1, relu) -> count, in the fused float graph
    "ic_resnet8": {("Conv", False, True): 4, ("Conv", False, False): 5, ("Add", False, True): 3,
                   ("AvgPool", False, False): 1, ("Flatten", False, None): 1,
                   ("Dense", False, False): 1, ("Softmax", False, None): 1},
    "kws_dscnn": {("Conv", False, True): 5, ("Conv", True, True): 4,
                  ("AvgPool", False, False): 1, ("Flatten", False, None): 1,
                  ("Dense", False, False): 1, ("Softmax", False, None): 1},
    "vww_mobilenet": {("Conv", False, True): 14, ("Conv", True, True): 13,
                      ("AvgPool", False, False): 1, ("Flatten", False, None): 1,
                      ("Dense", False, False): 1, ("Softmax", False, None): 1},
    "ad_autoencoder": {("Dense", False, True): 9, ("Dense", False, False): 1},
}


@pytest.mark.parametrize("name", sorted(MLPERF_TINY))
def test_mlperf_tiny_fused_structure(name):
    graph = zoo_graph(name)
    counts = collections.Counter((n.op, n.attrs.get("group", 1) > 1, n.attrs.get("relu"))
                                 for n in graph.nodes)
    assert counts == EXPECTED[name]
    last = graph.nodes[-1]
    assert last.outputs == graph.outputs == ("output",)
    if name != "ad_autoencoder":
        assert last.op == "Softmax" and last.attrs["axis"] == 1
    for node in graph.nodes:
        if node.op == "Conv" and node.attrs["group"] > 1:
            weight = graph.constants[node.inputs[1]]
            assert node.attrs["group"] == weight.shape[0] and weight.shape[1] == 1
        if node.op in ("Conv", "Dense", "Add", "AvgPool"):
            assert node.attrs["act_max"] is None
    if name == "ic_resnet8":
        for add in (n for n in graph.nodes if n.op == "Add"):
            assert all(graph.producer(v) is not None for v in add.inputs)   # two run-time inputs
            assert graph.types[add.inputs[0]] == graph.types[add.inputs[1]]
