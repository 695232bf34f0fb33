"""ONNX IR conformance, model level: IR versions, operator set imports and the resolution of
operators, metadata, training information ("Models", "Operator Sets", "Operators",
"Optional Metadata", "Training Related Information")."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from hwonnx.errors import ModelError, UnsupportedOperatorError
from hwonnx.frontend import load_model

from helpers import raises
from spec_helpers import SUPPORTED, check_against_ort, make_model, rand, relu_model

RULE_OP = ("(ONNX IR: each operator used MUST be declared by an imported operator set)")


# IR versions --------------------------------------------------------------------------------

@pytest.mark.parametrize("ir_version", range(3, onnx.IR_VERSION + 1))
def test_every_published_ir_version_is_read(ir_version):
    model = relu_model(ir=ir_version, opset=13)
    if ir_version < onnx.IR_VERSION:                      # the newest is beyond onnxruntime
        graph = check_against_ort(model)
    else:
        graph = load_model(model)
    assert graph.meta["ir_version"] == ir_version


@pytest.mark.parametrize("ir_version", [1, 2])
def test_ir_versions_before_opset_import_imply_opset_1(ir_version):
    model = make_model([helper.make_node("Relu", ["x"], ["r"]),
                        helper.make_node("Add", ["r", "b"], ["y"])],
                       {"x": [1, 4], "b": [1, 4]}, {"y": [1, 4]}, {"b": rand(1, 4)},
                       ir=ir_version)
    del model.opset_import[:]
    graph = load_model(model)
    assert graph.meta["opset"] == 1 and graph.meta["ir_version"] == ir_version
    assert graph.meta["notes"] == (
        f"ir_version {ir_version} predates opset_import; read as ai.onnx opset 1, which such "
        f"models implicitly import",
        "Converted ai.onnx opset 1 to 13 with onnx's version converter")
    x = rand(1, 4, seed=5)
    from hwonnx.ir.evaluate import evaluate_float
    np.testing.assert_allclose(evaluate_float(graph, {"x": x})["y"],
                               np.maximum(x, 0) + rand(1, 4), rtol=1e-6)


def test_ir_version_1_attributes_without_type():
    model = make_model([helper.make_node("Flatten", ["x"], ["y"], axis=1)], {"x": [1, 2, 3]},
                       {"y": [1, 6]}, ir=1)
    del model.opset_import[:]
    model.graph.node[0].attribute[0].ClearField("type")
    assert load_model(model).nodes[0].attrs["axis"] == 1
    model.ir_version = 3
    model.opset_import.add(domain="", version=1)
    with raises(ModelError, "Attribute 'axis' of node 'Flatten_0' must have a type (ONNX IR: "
                "attributes MUST have a name and a type)"):
        load_model(model)


# Operator set imports -----------------------------------------------------------------------

def test_ai_onnx_is_the_default_domain():
    model = relu_model(opsets=[helper.make_opsetid("ai.onnx", 17)])
    model.graph.node[0].domain = "ai.onnx"
    graph = check_against_ort(relu_model())
    assert load_model(model).meta["opset_imports"] == graph.meta["opset_imports"] == {
        "ai.onnx": 17}


def test_opset_version_must_be_positive():
    with raises(ModelError, "Model opset_import gives domain 'com.example' version 0; operator "
                "set versions start at 1"):
        load_model(relu_model(opsets=[helper.make_opsetid("", 17),
                                      helper.make_opsetid("com.example", 0)]))


def test_opset_newer_than_onnx_knows():
    newest = onnx.defs.onnx_opset_version()
    with raises(ModelError, f"Model imports ai.onnx opset {newest + 1}, newer than {newest}, "
                f"the newest onnx {onnx.__version__} knows; upgrade onnx or re-export the model "
                f"with opset {newest} or older"):
        load_model(relu_model(opset=newest + 1))


def test_operator_is_resolved_against_the_imported_version():
    gelu = [helper.make_node("Gelu", ["x"], ["y"], name="act")]
    with raises(ModelError, f"Node 'act' uses Gelu, which ai.onnx opset 17 does not define; it "
                f"first appears in opset 20 {RULE_OP}"):
        load_model(make_model(gelu, {"x": [1, 4]}, {"y": [1, 4]}, opset=17))
    # opset 20 defines it: a table operator (tests/operators/test_unary_tables.py)
    (node,) = load_model(make_model(gelu, {"x": [1, 4]}, {"y": [1, 4]}, opset=20)).nodes
    assert (node.op, node.attrs) == ("Gelu", {"approximate": "none"})


def test_operator_no_version_defines():
    model = make_model([helper.make_node("Frobnicate", ["x"], ["y"], name="f")],
                       {"x": [1, 4]}, {"y": [1, 4]})
    with raises(ModelError, f"Node 'f' uses Frobnicate, which ai.onnx opset 17 does not define "
                f"{RULE_OP}"):
        load_model(model)


def test_operator_of_an_unknown_imported_domain_is_unsupported_by_name():
    model = make_model([helper.make_node("Swish", ["x"], ["y"], name="sw", domain="com.acme")],
                       {"x": [1, 4]}, {"y": [1, 4]},
                       opsets=[helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 2)])
    with raises(UnsupportedOperatorError, "1 unsupported node(s): node 'sw' Swish (domain "
                f"'com.acme', opset 2); {SUPPORTED}"):
        load_model(model)


def test_signature_of_the_resolved_operator_is_checked():
    model = make_model([helper.make_node("Relu", ["x", "x"], ["y"], name="r")],
                       {"x": [1, 4]}, {"y": [1, 4]})
    with raises(ModelError, "Node 'r' does not fit the signature of Relu in ai.onnx opset 17: "
                "Node(r) with schema(::Relu:14) has input size 2 not in range [min=1, max=1]. "
                "(ONNX IR: a node's inputs, outputs and attributes MUST satisfy its operator's "
                "signature)"):
        load_model(model)
    model = make_model([helper.make_node("Gemm", ["x", "w"], ["y"], name="g", alpha="big")],
                       {"x": [1, 4]}, {"y": [1, 4]}, {"w": rand(4, 4)})
    with pytest.raises(ModelError, match=r"^Node 'g' does not fit the signature of Gemm in "
                       r"ai\.onnx opset 17: Mismatched attribute type in '.*alpha'.*\(ONNX IR: "
                       r"a node's inputs, outputs and attributes MUST satisfy its operator's "
                       r"signature\)$"):
        load_model(model)


# Metadata -----------------------------------------------------------------------------------

def test_metadata_and_standard_properties_are_carried():
    model = relu_model(producer_name="exporter", producer_version="3.1", model_version=5,
                       doc_string="*A* model", domain="org.example.models")
    helper.set_model_props(model, {"model_author": "Ada, Grace", "model_license": "MIT",
                                   "trained_on": "digits"})
    meta = check_against_ort(model).meta
    assert (meta["producer_name"], meta["producer_version"], meta["model_version"],
            meta["doc_string"], meta["domain"]) == ("exporter", "3.1", 5, "*A* model",
                                                    "org.example.models")
    assert meta["metadata_props"] == {"model_author": "Ada, Grace", "model_license": "MIT",
                                      "trained_on": "digits"}
    assert (meta["model_author"], meta["model_license"]) == ("Ada, Grace", "MIT")
    assert meta["warnings"] == ()


def test_duplicate_metadata_key_is_a_warning():
    model = relu_model()
    for value in ("a", "b"):
        model.metadata_props.add(key="model_author", value=value)
    meta = load_model(model).meta
    assert meta["model_author"] == "b"
    assert meta["warnings"] == ("metadata_props key 'model_author' appears 2 times; the last "
                                "value is used (ONNX IR: metadata keys should be distinct)",)


# Training information -----------------------------------------------------------------------

def training_model(init_binding=(("w", "w_init"),), update_binding=(("w", "w_new"),),
                   with_init=True):
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [1, 3]},
                       {"y": [1, 2]}, {"w": rand(3, 2)})
    info = model.training_info.add()
    if with_init:
        info.initialization.CopyFrom(helper.make_graph(
            [helper.make_node("Constant", [], ["w_init"], value=numpy_helper.from_array(
                np.zeros((3, 2), np.float32)))], "init", [],
            [helper.make_tensor_value_info("w_init", onnx.TensorProto.FLOAT, [3, 2])]))
    info.algorithm.CopyFrom(helper.make_graph(
        [helper.make_node("Identity", ["w"], ["w_new"])], "step", [],
        [helper.make_tensor_value_info("w_new", onnx.TensorProto.FLOAT, [3, 2])]))
    for key, value in init_binding:
        info.initialization_binding.add(key=key, value=value)
    for key, value in update_binding:
        info.update_binding.add(key=key, value=value)
    return model


def test_training_info_is_ignored_with_a_note():
    graph = check_against_ort(training_model())
    assert graph.meta["notes"] == ("Ignored training_info (1 entry): hwonnx runs inference "
                                   "only, as the ONNX IR allows",)


@pytest.mark.parametrize("kwargs, message", [
    (dict(init_binding=[("v", "w_init")]),
     "training_info[0] initialization_binding key 'v' must name an initializer of the main "
     "graph or of the algorithm graph (ONNX IR: binding keys MUST name initializers)"),
    (dict(update_binding=[("w", "nothing")]),
     "training_info[0] update_binding value 'nothing' must name an output of its graph (ONNX "
     "IR: binding values MUST name outputs of the initialization or algorithm graph)"),
    (dict(update_binding=[("w", "w_new"), ("w", "w_new")]),
     "training_info[0] update_binding binds 'w' twice (ONNX IR: binding keys MUST be unique)"),
    (dict(with_init=False),
     "training_info[0] has an initialization_binding but no initialization graph (ONNX IR: "
     "initialization MAY be omitted only if there are no initialization bindings)"),
])
def test_training_info_bindings_are_checked(kwargs, message):
    with raises(ModelError, message):
        load_model(training_model(**kwargs))
