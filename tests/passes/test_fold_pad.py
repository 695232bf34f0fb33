"""Run-time Mul, standalone BatchNormalization, Pad, Squeeze/Unsqueeze and Transpose mapped onto
the existing float IR (Conv, Dense, Reshape) by the frontend and the fold-pad and
batchnorm-to-conv passes."""

import numpy as np
import pytest
from onnx import helper

from hwonnx.errors import UnsupportedOperatorError
from hwonnx.frontend import load_model
from hwonnx.passes import FLOAT_PIPELINE, PassContext
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
    # now a host step between accelerator segments (tests/test_segments.py runs one).
    model = make_model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                        helper.make_node("Mul", ["r", "c"], ["y"], name="mask")],
                       {"x": [1, 2, 3, 3]}, {"y": [1, 2, 3, 3]}, {"c": rand(1, 1, 3, 3)})
    graph = load_model(model)
    assert graph.meta["host_steps"]["mask"] == {"at": "middle", "why": (
        "Mul has no hardware mapping (a constant of shape [1, 1, 3, 3] is neither a scalar nor "
        "per channel); between accelerator segments: the host reads its input back and writes "
        "its result, quantized, into the next segment")}


def test_mul_of_two_runtime_values_maps_to_the_element_wise_engine():
    """(Refused before the element-wise engine; tests/test_eltwise.py has the rest.)"""
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


# Pad ------------------------------------------------------------------------------------------

def pad_model(consumer, pads=(0, 0, 1, 2, 0, 0, 2, 1), opset=17, axes=None, mode=None,
              value=None, shape=(1, 2, 5, 6)):
    inits = {"pads": np.array(pads, np.int64), "w": rand(3, 2, 3, 3, seed=1)}
    pad_inputs = ["x", "pads"]
    if value is not None or axes is not None:
        pad_inputs.append("cv" if value is not None else "")
        if value is not None:
            inits["cv"] = np.float32(value)
    if axes is not None:
        pad_inputs.append("axes")
        inits["axes"] = np.array(axes, np.int64)
    pad = helper.make_node("Pad", pad_inputs, ["p"], name="pad",
                           **({"mode": mode} if mode else {}))
    nodes = [pad, consumer]
    return make_model(nodes, {"x": list(shape)}, {"y": [None] * 4}, inits, opset=opset)


def test_pad_folds_into_conv_pads():
    conv = helper.make_node("Conv", ["p", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])
    graph = check(pad_model(conv))
    (node,) = graph.nodes
    assert (node.op, node.inputs[0], node.attrs["pads"]) == ("Conv", "x", (2, 3, 3, 2))
    assert "p" not in graph.types


def test_pad_with_axes_input_folds_into_conv():
    conv = helper.make_node("Conv", ["p", "w"], ["y"], name="conv", strides=[2, 2])
    graph = check(pad_model(conv, pads=(1, 0, 1, 2), axes=(-2, -1), value=0.0, opset=18))
    assert [(n.op, n.attrs["pads"]) for n in graph.nodes] == [("Conv", (1, 0, 1, 2))]


@pytest.mark.parametrize("include", [1, 0])
def test_pad_folds_into_avgpool(include):
    pool = helper.make_node("AveragePool", ["p"], ["y"], name="pool", kernel_shape=[3, 3],
                            count_include_pad=include)
    graph = check(pad_model(pool, pads=(0, 0, 1, 1, 0, 0, 1, 2)))
    (node,) = graph.nodes
    assert (node.op, node.attrs["pads"], node.attrs["count_include_pad"]) == (
        "AvgPool", (1, 1, 1, 2), True)


def test_pad_conv_relu_still_fuses():
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], name="pad"),
             helper.make_node("Conv", ["p", "w", "b"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    model = make_model(nodes, {"x": [1, 2, 4, 4]}, {"y": [None] * 4},
                       {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
                        "w": rand(3, 2, 3, 3), "b": rand(3)})
    graph = check(model)
    assert [(n.op, n.attrs["pads"], n.attrs["relu"]) for n in graph.nodes] == [
        ("Conv", (1, 1, 1, 1), True)]


def test_pad_reflect_is_copies():
    """(Against onnxruntime and on the RTL: tests/test_slicing.py.)"""
    conv = helper.make_node("Conv", ["p", "w"], ["y"], name="conv")
    graph = load_model(pad_model(conv, mode="reflect"))
    assert {n.op for n in graph.nodes} == {"Slice", "Concat", "Conv"}


@pytest.mark.parametrize("kw", [{"value": float("nan")}, {"value": float("inf")},
                                {"pads": (0, 1, 0, 0, 0, 0, 0, 0)},
                                {"pads": (0, 0, -1, 0, 0, 0, 0, 0)}],
                         ids=["nan-value", "inf-value", "channel-axis", "negative"])
def test_pad_forms_are_unsupported(kw):
    conv = helper.make_node("Conv", ["p", "w"], ["y"], name="conv")
    with pytest.raises(UnsupportedOperatorError,
                       match=r"^1 unsupported node\(s\): node 'pad' Pad \(domain 'ai\.onnx', "
                             r"opset 17\) \(Pad 'pad' pads a 4-D input by \[.*\] with value "
                             r".*; only non-negative constant padding \(not NaN or \+inf\) of "
                             r"the two spatial axes .*\)$"):
        load_model(pad_model(conv, **kw))


@pytest.mark.parametrize("value", [0.75, -2.5])
def test_pad_of_another_value_folds_as_the_padding_value(value):
    conv = helper.make_node("Conv", ["p", "w"], ["y"], name="conv", strides=[1, 2])
    graph = check(pad_model(conv, value=value))
    (node,) = graph.nodes
    assert (node.op, node.attrs["pads"], node.attrs["pad_value"]) == (
        "Conv", (1, 2, 2, 1), value)


@pytest.mark.parametrize("value", [0.5, -65536.0, float("-inf")])
def test_pad_folds_into_maxpool(value):
    pool = helper.make_node("MaxPool", ["p"], ["y"], name="pool", kernel_shape=[3, 2],
                            strides=[2, 2])
    graph = check(pad_model(pool, pads=(0, 0, 1, 1, 0, 0, 2, 1), value=value))
    (node,) = graph.nodes
    assert (node.op, node.attrs["pads"]) == ("MaxPool", (1, 1, 2, 1))
    assert node.attrs.get("pad_value", float("-inf")) == value


def test_infinite_pad_with_windows_only_in_the_padding_stays_unfolded():
    pool = helper.make_node("MaxPool", ["p"], ["y"], name="pool", kernel_shape=[3, 2],
                            strides=[2, 2])
    with pytest.raises(UnsupportedOperatorError, match="Pad 'pad' is not read only by Conv"):
        load_model(pad_model(pool, value=float("-inf")))


def test_pad_of_another_value_folds_into_avgpool_without_pads():
    pool = helper.make_node("AveragePool", ["p"], ["y"], name="pool", kernel_shape=[3, 3])
    graph = check(pad_model(pool, value=2.0))
    (node,) = graph.nodes
    assert (node.attrs["pads"], node.attrs["count_include_pad"], node.attrs["pad_value"]) == (
        (1, 2, 2, 1), True, 2.0)


def test_pad_of_another_value_before_a_padded_conv_is_unsupported():
    conv = helper.make_node("Conv", ["p", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])
    with pytest.raises(UnsupportedOperatorError, match="Pad 'pad' is not read only by Conv"):
        load_model(pad_model(conv, value=1.0))


def test_pads_of_different_values_do_not_merge():
    """Pad(value 5) -> Pad(value 0) -> Conv: the zero Pad folds into the Conv, whose padding
    then has value 0, so the Pad of value 5 before it cannot fold and is refused by name
    (a zero-size Pad is an Identity and never sets the value)."""
    nodes = [helper.make_node("Pad", ["x", "pads", "five"], ["p1"], name="pad5"),
             helper.make_node("Pad", ["p1", "pads", "zero"], ["p2"], name="pad0"),
             helper.make_node("Pad", ["p2", "none", "seven"], ["p3"], name="empty"),
             helper.make_node("Conv", ["p3", "w"], ["y"], name="conv")]
    model = make_model(nodes, {"x": [1, 2, 4, 4]}, {"y": [None] * 4},
                       {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
                        "none": np.zeros(8, np.int64), "five": np.float32(5),
                        "zero": np.float32(0), "seven": np.float32(7), "w": rand(3, 2, 3, 3)})
    with pytest.raises(UnsupportedOperatorError, match="node 'pad5' Pad .*Pad 'pad5' is not "
                                                       "read only by Conv"):
        load_model(model)


def test_infinite_pad_before_a_conv_is_unsupported():
    conv = helper.make_node("Conv", ["p", "w"], ["y"], name="conv")
    with pytest.raises(UnsupportedOperatorError, match="Pad 'pad' is not read only by Conv"):
        load_model(pad_model(conv, value=float("-inf")))


def test_pad_not_before_conv_is_unsupported():
    relu = helper.make_node("Relu", ["p"], ["y"], name="relu")
    with pytest.raises(UnsupportedOperatorError,
                       match=r"^1 unsupported node\(s\): node 'pad' Pad \(domain 'ai\.onnx', "
                             r"opset 17\) \(Pad 'pad' is not read only by Conv, MaxPool or "
                             r"AveragePool nodes .*, so it cannot be folded; .*\)$"):
        load_model(pad_model(relu))


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
    # tests/test_host_fallback.py): a Permute the array copies (tests/test_fold_transpose.py).
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Transpose", ["r"], ["t"], name="nhwc", perm=[0, 2, 3, 1]),
             helper.make_node("Relu", ["t"], ["y"], name="relu2")]
    model = make_model(nodes, {"x": [1, 3, 4, 4]}, {"y": [1, 4, 4, 3]})
    graph = load_model(model)
    assert [(n.op, n.attrs.get("perm")) for n in graph.nodes] == [
        ("Relu", None), ("Permute", (0, 2, 3, 1))]
    assert graph.nodes[1].attrs["relu"]                  # the second Relu, fused


# Pipeline ------------------------------------------------------------------------------------

def test_pipeline_order():
    assert [p.name for p in FLOAT_PIPELINE] == [
        "fold-transpose", "remove-identity", "channel-shuffle", "fold-pad", "fold-batchnorm",
        "batchnorm-to-conv", "fuse-bias", "fold-scale", "fuse-relu", "fuse-clip"]


def test_skipping_fold_pad_leaves_the_pad_refused():
    conv = helper.make_node("Conv", ["p", "w"], ["y"], name="conv")
    with pytest.raises(UnsupportedOperatorError, match=r"^1 unsupported node\(s\): node 'pad' "):
        load_model(pad_model(conv), pass_context=PassContext(skip=frozenset({"fold-pad"})))
