"""ONNX IR conformance, operator set versions: old opsets are converted to the version hwonnx
implements (onnx's version converter, one step at a time when needed, plus hwonnx's own
handling of legacy broadcasting), new ones are read as they are, up to onnx's newest."""

import numpy as np
import onnx
import pytest
from onnx import helper

from hwonnx.errors import ModelError
from hwonnx.frontend import load_model
from hwonnx.frontend.opsets import MIN_OPSET
from hwonnx.ir.evaluate import evaluate_float

from helpers import raises
from spec_helpers import check_against_ort, make_model, rand

CONVERTED = "Converted ai.onnx opset {} to 13 with onnx's version converter"


def cnn(opset, ir=3, gemm_attrs=None, extra_bn=None):
    """Conv -> BN -> Relu -> Flatten -> Dropout -> Gemm in the spelling of ``opset``;
    before IR 4 every initializer is also a graph input."""
    inits = {"w": rand(4, 2, 3, 3), "cb": rand(4), "s": rand(4), "b": rand(4), "m": rand(4),
             "v": np.abs(rand(4)) + 0.5, "g": rand(5, 16), "c": rand(5)}
    bn_attrs = dict(extra_bn or {})
    dropout = {"is_test": 1} if opset < 7 else {}
    nodes = [
        helper.make_node("Conv", ["x", "w", "cb"], ["conv"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["conv", "s", "b", "m", "v"], ["bn"],
                         **bn_attrs),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"]),
        helper.make_node("Dropout", ["f"], ["d"], **dropout),
        helper.make_node("Gemm", ["d", "g", "c"], ["y"], transB=1, **(gemm_attrs or {})),
    ]
    model = make_model(nodes, {"x": [1, 2, 4, 4]}, {"y": [1, 5]}, inits, opset=opset, ir=ir)
    if ir < 4:
        model.graph.input.extend(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT,
                                                               value.shape)
                                 for name, value in inits.items())
    return model


@pytest.mark.parametrize("opset, kwargs", [
    (7, dict(extra_bn={"spatial": 1})),
    (9, {}),
    (10, {}),
    (11, {}),
    (12, {}),
])
def test_old_opsets_are_converted(opset, kwargs):
    model = cnn(opset, **kwargs)
    graph = check_against_ort(model)
    assert graph.meta["opset"] == opset
    assert graph.meta["notes"] == (CONVERTED.format(opset),)
    assert [n.op for n in graph.nodes] == ["Conv", "Flatten", "Dense"]


def test_opset_6_spelling_is_converted():
    # onnxruntime has no kernels for opset 6 Gemm and Dropout: compare with opset 7 instead.
    model = cnn(6, extra_bn={"is_test": 1, "spatial": 1}, gemm_attrs={"broadcast": 1})
    graph = load_model(model)
    assert graph.meta["notes"] == (CONVERTED.format(6),)
    reference = check_against_ort(cnn(7, extra_bn={"spatial": 1}))
    x = rand(1, 2, 4, 4, seed=9)
    np.testing.assert_allclose(evaluate_float(graph, {"x": x})["y"],
                               evaluate_float(reference, {"x": x})["y"], rtol=1e-5)


def test_opset_1_is_converted_one_version_at_a_time():
    # Add-1 broadcasting needs input shapes the direct conversion cannot see.
    model = make_model([helper.make_node("Relu", ["x"], ["r"], consumed_inputs=[0]),
                        helper.make_node("Add", ["r", "b"], ["y"], broadcast=1)],
                       {"x": [1, 4], "b": [4]}, {"y": [1, 4]}, {"b": rand(4)}, opset=1, ir=3)
    graph = load_model(model)
    assert graph.meta["notes"] == (CONVERTED.format(1),)
    x = rand(1, 4, seed=2)
    np.testing.assert_allclose(evaluate_float(graph, {"x": x})["y"], np.maximum(x, 0) + rand(4),
                               rtol=1e-6)


def test_legacy_broadcast_along_an_axis_is_aligned_by_hwonnx():
    # onnx's converter unsqueezes B to [3, 1, 1, 1] here; numpy needs [3, 1, 1].
    model = make_model([helper.make_node("Add", ["x", "b"], ["y"], name="add", broadcast=1,
                                         axis=1)],
                       {"x": [1, 3, 2, 2], "b": [3]}, {"y": [1, 3, 2, 2]}, {"b": rand(3)},
                       opset=6, ir=3)
    graph = load_model(model)
    assert graph.meta["notes"] == (
        "Aligned 'b' of Add 'add' for numpy broadcasting (legacy axis=1)", CONVERTED.format(6))
    x = rand(1, 3, 2, 2, seed=1)
    np.testing.assert_allclose(evaluate_float(graph, {"x": x})["y"],
                               x + rand(3).reshape(3, 1, 1), rtol=1e-6)


def test_legacy_broadcast_of_a_runtime_value_is_refused():
    model = make_model([helper.make_node("Add", ["x", "z"], ["y"], name="add", broadcast=1,
                                         axis=0)],
                       {"x": [2, 3], "z": [2]}, {"y": [2, 3]}, opset=6, ir=3)
    with raises(ModelError, "Node 'add' (Add, opset < 7) broadcasts 'z' along axis 0, which "
                "hwonnx converts only for a constant 'z' and an input of known rank; re-export "
                "the model with opset 7 or newer"):
        load_model(model)


@pytest.mark.parametrize("node, message", [
    (helper.make_node("Dropout", ["x"], ["y"], is_test=0),
     "Cannot convert the model from ai.onnx opset 6 to 7 with onnx's version converter "
     "(`node->i(attr) != value` failed: Attribute is_test must not have value 0); re-export it "
     "with opset 13 or newer"),
])
def test_conversion_failure_names_the_step(node, message):
    model = make_model([node], {"x": [1, 3]}, {"y": [1, 3]}, opset=1, ir=3)
    with raises(ModelError, message):
        load_model(model)


@pytest.mark.parametrize("opset", sorted({MIN_OPSET, 14, 15, 18, 19, 21, 22, 23}))
def test_newer_opsets_are_read_as_they_are(opset):
    graph = check_against_ort(cnn(opset, ir=8))
    assert graph.meta["opset"] == opset and graph.meta["notes"] == ()


def test_newest_opset_onnx_knows_is_read():
    newest = onnx.defs.onnx_opset_version()
    graph = load_model(cnn(newest, ir=onnx.IR_VERSION))
    reference = check_against_ort(cnn(MIN_OPSET, ir=8))
    x = rand(1, 2, 4, 4, seed=7)
    np.testing.assert_allclose(evaluate_float(graph, {"x": x})["y"],
                               evaluate_float(reference, {"x": x})["y"], rtol=1e-6)
