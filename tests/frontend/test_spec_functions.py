"""ONNX IR conformance, functions and nested subgraphs: model-local functions are checked and
inlined; an If whose condition is constant is replaced by its branch; any other control flow is
refused by node name ("Functions", "Nodes" on nested subgraphs)."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from hwonnx.errors import ModelError, UnsupportedOperatorError
from hwonnx.frontend import load_model
from hwonnx.ir.evaluate import evaluate_float

from helpers import raises
from spec_helpers import FLOAT, SUPPORTED, check_against_ort, make_model, rand

LOCAL = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]


def dense_relu(name="DenseRelu", nodes=None, **kw):
    """local.DenseRelu(x, w, b) = Relu(x @ w + b)."""
    return helper.make_function("local", name, ["x", "w", "b"], ["y"], nodes or [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"])], [helper.make_opsetid("", 17)], **kw)


def two_layers(functions, calls=None, opsets=LOCAL):
    calls = calls or [
        helper.make_node("DenseRelu", ["x", "w1", "b1"], ["h"], name="layer1", domain="local"),
        helper.make_node("DenseRelu", ["h", "w2", "b2"], ["y"], name="layer2", domain="local")]
    return make_model(calls, {"x": [1, 4]}, {"y": [1, 3]},
                      {"w1": rand(4, 5), "b1": rand(5), "w2": rand(5, 3), "b2": rand(3)},
                      opsets=opsets, functions=functions)


# Model-local functions ----------------------------------------------------------------------

def test_local_functions_are_inlined_and_named_after_the_call():
    graph = check_against_ort(two_layers([dense_relu()]))
    assert [(n.op, n.name) for n in graph.nodes] == [("Dense", "layer1/mm"),
                                                     ("Dense", "layer2/mm")]
    assert graph.meta["notes"] == ("Inlined 2 call(s) of model-local functions "
                                   "('local.DenseRelu')",)


def test_nested_functions_and_attribute_parameters():
    inner = helper.make_function(
        "local", "Affine", ["x", "w", "b"], ["y"],
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="gemm")],
        [helper.make_opsetid("", 17)], attributes=["alpha"])
    inner.node[0].attribute.append(onnx.AttributeProto(name="alpha", ref_attr_name="alpha",
                                                        type=onnx.AttributeProto.FLOAT))
    outer = dense_relu(nodes=[
        helper.make_node("Affine", ["x", "w", "b"], ["a"], name="affine", domain="local",
                         alpha=0.5),
        helper.make_node("Relu", ["a"], ["y"], name="act")])
    outer.opset_import.append(helper.make_opsetid("local", 1))
    graph = check_against_ort(two_layers([outer, inner]))
    assert [n.name for n in graph.nodes] == ["layer1/affine/gemm", "layer2/affine/gemm"]


def test_function_written_for_an_older_opset_is_converted():
    old = dense_relu()
    old.opset_import[0].version = 11
    check_against_ort(two_layers([old]))


def test_recursive_function_is_refused():
    rec = helper.make_function("local", "Rec", ["x"], ["y"], [
        helper.make_node("Rec", ["x"], ["y"], domain="local")], LOCAL)
    model = make_model([helper.make_node("Rec", ["x"], ["y"], domain="local")], {"x": [1, 4]},
                       {"y": [1, 4]}, opsets=LOCAL, functions=[rec])
    with raises(ModelError, "Model-local function 'local.Rec' -> 'local.Rec' calls itself; "
                "functions must not be recursive"):
        load_model(model)


@pytest.mark.parametrize("functions, message", [
    ([dense_relu(), dense_relu()], "Model-local function 'local.DenseRelu' is defined twice "
     "(ONNX IR: domain, name and overload identify a function uniquely)"),
    ([dense_relu(nodes=[helper.make_node("Relu", ["z"], ["y"], name="r")])],
     "Function 'local.DenseRelu': Node 'r' reads 'z', which is not a function input, an "
     "initializer or a node output"),
    ([dense_relu(nodes=[helper.make_node("Relu", ["x"], ["t"], name="r")])],
     "Function 'local.DenseRelu': Function output 'y' is never produced (ONNX IR: every "
     "graph output must be defined)"),
    ([dense_relu(nodes=[helper.make_node("Relu", ["x"], ["y"], name="r"),
                        helper.make_node("Relu", ["x"], ["y"], name="s")])],
     "Function 'local.DenseRelu': Value 'y' is defined twice, by node 'r' and by node 's' "
     "(ONNX IR: single static assignment)"),
])
def test_function_rules(functions, message):
    with raises(ModelError, message):
        load_model(two_layers(functions))


def test_undeclared_attribute_reference_is_refused():
    function = dense_relu(nodes=[helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="g")])
    function.node[0].attribute.append(onnx.AttributeProto(name="alpha", ref_attr_name="scale",
                                                          type=onnx.AttributeProto.FLOAT))
    with raises(ModelError, "Function 'local.DenseRelu': node 'g' refers to attribute 'scale', "
                "which the function does not declare"):
        load_model(two_layers([function]))


def test_call_that_does_not_fit_the_function():
    calls = [helper.make_node("DenseRelu", ["x", "w1", "b1"], ["y"], name="layer1",
                              domain="local", alpha=2.0)]
    with raises(ModelError, "Node 'layer1' gives attribute 'alpha', which function "
                "'local.DenseRelu' does not declare"):
        load_model(two_layers([dense_relu()], calls))


def test_function_domain_must_be_imported():
    with raises(ModelError, "Node 'layer1' uses DenseRelu of domain 'local', which the model's "
                "opset_import does not import (ONNX IR: each operator used MUST be declared by "
                "an imported operator set)"):
        load_model(two_layers([dense_relu()], opsets=LOCAL[:1]))


def test_function_of_an_imported_domain_hwonnx_does_not_know_is_refused_by_name():
    model = two_layers([], opsets=LOCAL)
    with raises(UnsupportedOperatorError, "2 unsupported node(s): node 'layer1' DenseRelu "
                "(domain 'local', opset 1); node 'layer2' DenseRelu (domain 'local', opset 1); "
                f"{SUPPORTED}"):
        load_model(model)


# Nested subgraphs: If and other control flow ------------------------------------------------

def branch(name, nodes, outputs, inits=None):
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(o, FLOAT, None)
                                               for o in outputs],
                             [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])


def if_model(condition_nodes, cond="cond", then=None, orelse=None, inputs=None):
    then = then or branch("then", [helper.make_node("MatMul", ["x", "w"], ["t"], name="mm")],
                          ["t"])
    orelse = orelse or branch("else", [], ["bias"], {"bias": rand(1, 2)})
    nodes = condition_nodes + [
        helper.make_node("If", [cond], ["h"], name="choose", then_branch=then,
                         else_branch=orelse),
        helper.make_node("Relu", ["h"], ["y"], name="act")]
    return make_model(nodes, inputs or {"x": [1, 3]}, {"y": [1, 2]}, {"w": rand(3, 2)})


@pytest.mark.parametrize("value, ops", [(True, ["Dense"]), (False, ["Identity"])])
def test_if_with_a_constant_condition_is_replaced_by_its_branch(value, ops):
    condition = [helper.make_node("Constant", [], ["k"], value_float=2.0),
                 helper.make_node("Constant", [], ["limit"], value_float=1.0),
                 helper.make_node(("Greater" if value else "Less"), ["k", "limit"], ["cond"])]
    model = if_model(condition)
    graph = check_against_ort(model)
    assert [n.op for n in graph.nodes][:1] == ops[:1] or not graph.nodes
    which = "then_branch" if value else "else_branch"
    assert graph.meta["notes"] == (f"If 'choose' has a constant condition ({value}); replaced "
                                   f"by its {which}",)


def test_if_on_the_static_shape_of_an_input():
    condition = [helper.make_node("Shape", ["x"], ["s"]),
                 helper.make_node("Constant", [], ["three"], value_ints=[1, 3]),
                 helper.make_node("Equal", ["s", "three"], ["eq"]),
                 helper.make_node("Cast", ["eq"], ["eqi"], to=onnx.TensorProto.INT64),
                 helper.make_node("ReduceMin", ["eqi"], ["all"], keepdims=0),
                 helper.make_node("Cast", ["all"], ["cond"], to=onnx.TensorProto.BOOL)]
    graph = check_against_ort(if_model(condition))
    assert [n.name for n in graph.nodes] == ["choose/mm"]


def test_if_with_a_runtime_condition_is_refused_by_name():
    model = if_model([], cond="flag", inputs={"x": [1, 3], "flag": []})
    model.graph.input[1].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    with raises(UnsupportedOperatorError, "1 unsupported node(s): node 'choose' If (domain "
                "'ai.onnx', opset 17) (If 'choose' has condition 'flag', which is not a "
                "constant hwonnx can fold; an If is read only when its condition is constant, "
                f"and is replaced by the branch it selects); {SUPPORTED}"):
        load_model(model)


@pytest.mark.parametrize("op, attrs", [
    ("Loop", {"body": branch("body", [helper.make_node("Identity", ["x"], ["c"])], ["c"])}),
    ("Scan", {"body": branch("body", [helper.make_node("Identity", ["x"], ["c"])], ["c"]),
              "num_scan_inputs": 1}),
])
def test_other_control_flow_is_refused_by_name(op, attrs):
    model = make_model([helper.make_node(op, ["x"], ["y"], name="flow", **attrs)],
                       {"x": [1, 4]}, {"y": [1, 4]})
    with raises(UnsupportedOperatorError, f"1 unsupported node(s): node 'flow' {op} (domain "
                f"'ai.onnx', opset 17) ({op} 'flow' is control flow, which hwonnx does not "
                f"support); {SUPPORTED}"):
        load_model(model)


def true_condition():
    return [helper.make_node("Constant", [], ["cond"], value=numpy_helper.from_array(
        np.array(True)))]


@pytest.mark.parametrize("then, message", [
    (branch("", [helper.make_node("Relu", ["x"], ["t"])], ["t"]),
     "The then_branch of If 'choose': the graph must have a name (ONNX IR: each graph MUST "
     "specify a name)"),
    (branch("then", [helper.make_node("Relu", ["x"], ["t"])], ["t", "x"]),
     "The then_branch of If 'choose': the graph has 2 output(s), but the If node has 1"),
    (branch("then", [helper.make_node("Relu", ["x"], ["w"], name="inner")], ["w"]),
     "The then_branch of If 'choose': Value 'w' is defined twice, by an outer graph and by "
     "node 'inner' (ONNX IR: single static assignment)"),
])
def test_branch_rules(then, message):
    with raises(ModelError, message):
        load_model(if_model(true_condition(), then=then))


def test_branch_with_inputs_is_refused():
    then = branch("then", [helper.make_node("Relu", ["x"], ["t"])], ["t"])
    then.input.append(helper.make_tensor_value_info("z", FLOAT, [1]))
    with raises(ModelError, "The then_branch of If 'choose': the graph must have no inputs, not "
                "1 (If branches take no inputs)"):
        load_model(if_model(true_condition(), then=then))


def test_nested_if_reading_the_outer_scope():
    inner = helper.make_node("If", ["cond"], ["t"], name="inner", then_branch=branch(
        "inner_then", [helper.make_node("MatMul", ["x", "w"], ["t2"], name="mm")], ["t2"]),
        else_branch=branch("inner_else", [helper.make_node("Identity", ["x"], ["t3"])],
                           ["t3"]))
    then = branch("then", [inner], ["t"])
    graph = check_against_ort(if_model(true_condition(), then=then))
    assert [n.name for n in graph.nodes] == ["choose/inner/mm"]


def test_branch_returning_an_outer_value_directly():
    # onnxruntime refuses this model (it wants an Identity); the ONNX IR allows it.
    model = if_model(true_condition(), then=branch("then", [], ["x"]), inputs={"x": [1, 2]})
    graph = load_model(model)
    x = rand(1, 2, seed=8)
    np.testing.assert_array_equal(evaluate_float(graph, {"x": x})["y"], np.maximum(x, 0))
