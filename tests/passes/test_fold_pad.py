"""Pad mapped onto the existing float IR by the ``fold-pad`` pass: folded into the pads of the
Conv, MaxPool or AveragePool that reads it (also a Pad of another value, where the window
allows it), and its forms that cannot fold refused; the float pipeline's order."""

import numpy as np
import pytest
from onnx import helper

from hwonnx.errors import UnsupportedOperatorError
from hwonnx.frontend import load_model
from hwonnx.passes import FLOAT_PIPELINE, PassContext
from spec_helpers import check_against_ort, make_model, rand


def check(model, **load_args):
    """Load ``model``, compare evaluate_float with onnxruntime, return the graph."""
    return check_against_ort(model, seed=5, rtol=1e-4, atol=1e-5, **load_args)


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
    """(Against onnxruntime and on the RTL: tests/operators/test_slicing.py.)"""
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


# Pipeline ------------------------------------------------------------------------------------

def test_pipeline_order():
    assert [p.name for p in FLOAT_PIPELINE] == [
        "fold-transpose", "remove-identity", "channel-shuffle", "fold-pad", "fold-batchnorm",
        "batchnorm-to-conv", "fuse-bias", "fold-scale", "fuse-relu", "fuse-clip"]


def test_skipping_fold_pad_leaves_the_pad_refused():
    conv = helper.make_node("Conv", ["p", "w"], ["y"], name="conv")
    with pytest.raises(UnsupportedOperatorError, match=r"^1 unsupported node\(s\): node 'pad' "):
        load_model(pad_model(conv), pass_context=PassContext(skip=frozenset({"fold-pad"})))
