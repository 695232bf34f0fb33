"""ONNX IR conformance, graphs: the graph's name and signature, initializers (defaults and
constants, sparse ones), value_info, Constant nodes, the value and node namespaces (SSA,
topological order, no cycles), optional inputs and outputs, attributes ("Graphs", "Names
Within a Graph", "Nodes", "Attributes", "Optional Inputs and Outputs")."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from hwonnx.errors import ModelError, UsageError
from hwonnx.frontend import load_model, read_overrides

from helpers import raises
from spec_helpers import FLOAT, check_against_ort, make_model, rand, relu_model

SSA = "(ONNX IR: single static assignment)"


def mlp(**kw):
    return make_model([helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
                       helper.make_node("Add", ["m", "b"], ["y"], name="add")],
                      {"x": [1, 3]}, {"y": [1, 2]}, {"w": rand(3, 2), "b": rand(2)}, **kw)


# The graph and its signature ----------------------------------------------------------------

def test_graph_must_have_a_name():
    model = relu_model()
    model.graph.name = ""
    with raises(ModelError, "The main graph must have a name (ONNX IR: each graph MUST specify "
                "a name)"):
        load_model(model)


@pytest.mark.parametrize("field, role", [("input", "Graph input"), ("output", "Graph output")])
def test_signature_values_must_have_names(field, role):
    model = relu_model()
    getattr(model.graph, field)[0].name = ""
    with raises(ModelError, f"{role} must have a name (ONNX IR: graphs MUST define the names of "
                f"their inputs and outputs)"):
        load_model(model)


def test_signature_values_must_have_an_element_type():
    model = relu_model()
    model.graph.output[0].type.tensor_type.elem_type = 0
    with raises(ModelError, "Graph output 'y' must have an element type (ONNX IR: main graph "
                "inputs and outputs MUST define their types)"):
        load_model(model)


def test_graph_output_listed_twice():
    model = relu_model()
    model.graph.output.append(model.graph.output[0])
    with raises(ModelError, "Graph output 'y' is listed twice (ONNX IR: names MUST be unique in "
                "the value namespace)"):
        load_model(model)


def test_graph_output_may_be_a_graph_input():
    model = make_model([], {"x": [1, 4]}, {"x": [1, 4]})
    graph = check_against_ort(model)
    assert graph.inputs == graph.outputs == ("x",)


# Initializers -------------------------------------------------------------------------------

def test_initializer_that_is_an_input_is_a_default_the_user_may_override():
    model = mlp()
    model.graph.input.append(helper.make_tensor_value_info("b", FLOAT, [2]))
    graph = check_against_ort(model)
    assert graph.inputs == ("x",) and graph.meta["notes"] == ()
    np.testing.assert_array_equal(graph.constants[graph.nodes[0].inputs[2]], rand(2))
    other = np.arange(2, dtype=np.float32)
    graph = load_model(model, override_initializers={"b": other})
    np.testing.assert_array_equal(graph.constants[graph.nodes[0].inputs[2]], other)
    assert graph.meta["notes"] == ("Initializer 'b' overridden by a value given by the user",)


def test_override_files_for_the_command_line(tmp_path):
    np.save(tmp_path / "b.npy", np.arange(2, dtype=np.float32))
    overrides = read_overrides([f"b={tmp_path / 'b.npy'}"])
    model = mlp()
    model.graph.input.append(helper.make_tensor_value_info("b", FLOAT, [2]))
    graph = load_model(model, override_initializers=overrides)
    np.testing.assert_array_equal(graph.constants[graph.nodes[0].inputs[2]], [0, 1])
    with raises(UsageError, "--override-initializer must be NAME=file.npy, not 'b'"):
        read_overrides(["b"])
    with raises(UsageError, f"Cannot read the override for 'b' from '{tmp_path}/no.npy': No "
                f"such file or directory"):
        read_overrides([f"b={tmp_path}/no.npy"])
    with raises(ModelError, "Cannot override 'w': it is not a graph input with an initializer; "
                "overridable values are b"):
        load_model(model, override_initializers={"w": rand(3, 2)})


def test_initializer_must_have_a_name():
    model = mlp()
    model.graph.initializer[1].name = ""
    with raises(ModelError, "Every initializer must have a name (ONNX IR: an initializer is a "
                "named tensor value)"):
        load_model(model)


def test_initializer_defined_twice():
    model = mlp()
    model.graph.initializer.append(model.graph.initializer[1])
    with raises(ModelError, f"Value 'b' is defined twice, by an initializer and by an "
                f"initializer {SSA}"):
        load_model(model)
    model = mlp()
    model.graph.input.append(model.graph.input[0])
    with raises(ModelError, f"Value 'x' is defined twice, by a graph input and by a graph input "
                f"{SSA}"):
        load_model(model)


def test_sparse_initializers_are_densified():
    model = mlp()
    dense = np.array([[0, 1.5], [0, 0], [-2, 0]], np.float32)
    del model.graph.initializer[0]
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.5, -2], np.float32), "w"),
        numpy_helper.from_array(np.array([1, 4], np.int64)), [3, 2]))
    graph = check_against_ort(model)
    np.testing.assert_array_equal(graph.constants["w"], dense)
    assert graph.meta["notes"] == ("Densified sparse initializer 'w' (2 of 6 values stored)",)
    coordinates = numpy_helper.from_array(np.array([[0, 1], [2, 0]], np.int64))
    model.graph.sparse_initializer[0].indices.CopyFrom(coordinates)
    np.testing.assert_array_equal(check_against_ort(model).constants["w"], dense)


def test_sparse_initializer_index_out_of_range():
    model = mlp()
    del model.graph.initializer[0]
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.5], np.float32), "w"),
        numpy_helper.from_array(np.array([6], np.int64)), [3, 2]))
    with raises(ModelError, "Sparse initializer 'w' has an index outside its 6 elements"):
        load_model(model)


# value_info ---------------------------------------------------------------------------------

def test_value_info_is_used_and_its_variables_bound():
    model = mlp()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    model.graph.value_info.append(helper.make_tensor_value_info("m", FLOAT, ["N", 2]))
    graph = check_against_ort(model)
    assert graph.meta["dim_bindings"] == {"N": 1}


def test_value_info_contradicting_the_operator_is_refused():
    model = mlp()
    model.graph.value_info.append(helper.make_tensor_value_info("m", FLOAT, [1, 5]))
    with pytest.raises(ModelError, match=r"^Shape inference failed: .*node name: mm.*"
                       r"differ in dimension 1: \(2\) vs \(5\) .*$"):
        load_model(model)


# Constant nodes -----------------------------------------------------------------------------

@pytest.mark.parametrize("attrs", [
    {"value": numpy_helper.from_array(np.array([1, -1], np.int64))},
    {"value_ints": [1, -1]},
    {"sparse_value": helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1, -1], np.int64)),
        numpy_helper.from_array(np.array([0, 1], np.int64)), [2])},
])
def test_constant_node_forms_for_a_shape(attrs):
    model = make_model([helper.make_node("Constant", [], ["s"], name="shape", **attrs),
                        helper.make_node("Reshape", ["x", "s"], ["y"])],
                       {"x": [1, 2, 3]}, {"y": [1, 6]})
    assert [n.op for n in check_against_ort(model).nodes] == ["Reshape"]


@pytest.mark.parametrize("attrs", [
    {"value_float": 2.5}, {"value_floats": [1.0, -2.0, 0.5]},
    {"value_int": 3}, {"value_ints": [1, 2, 3]},
    {"value": numpy_helper.from_array(rand(1, 3))},
])
def test_constant_node_forms_for_a_bias(attrs):
    cast = attrs.keys() & {"value_int", "value_ints"}
    nodes = [helper.make_node("Constant", [], ["c0" if cast else "c"], **attrs)]
    if cast:
        nodes.append(helper.make_node("Cast", ["c0"], ["c"], to=FLOAT))
    nodes.append(helper.make_node("Add", ["x", "c"], ["y"]))
    graph = check_against_ort(make_model(nodes, {"x": [1, 3]}, {"y": [1, 3]}))
    assert [n.op for n in graph.nodes] == ["Add"]


def test_constant_string_is_refused_by_name():
    model = make_model([helper.make_node("Constant", [], ["s"], name="label",
                                         value_string="cat"),
                        helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 3]}, {"y": [1, 3]})
    with raises(ModelError, "Constant 'label' has a string value (value_string); hwonnx reads "
                "only float, integer and bool tensors"):
        load_model(model)


# Names, SSA and order -----------------------------------------------------------------------

def test_node_output_must_not_redefine_a_graph_input():
    model = make_model([helper.make_node("Relu", ["x"], ["x"], name="r")], {"x": [1, 4]},
                       {"x": [1, 4]})
    with raises(ModelError, f"Value 'x' is defined twice, by a graph input and by node 'r' "
                f"{SSA}"):
        load_model(model)


def test_cycle_is_named():
    model = make_model([helper.make_node("Add", ["x", "c"], ["a"], name="first"),
                        helper.make_node("Relu", ["a"], ["b"], name="second"),
                        helper.make_node("Relu", ["b"], ["c"], name="third"),
                        helper.make_node("Identity", ["b"], ["y"])], {"x": [1, 4]},
                       {"y": [1, 4]})
    with raises(ModelError, "Nodes 'first' -> 'third' -> 'second' -> 'first' form a cycle "
                "(ONNX IR: node dependencies MUST NOT create cycles)"):
        load_model(model)


def test_node_names_are_optional_and_must_be_unique():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"],
                                                                      name="Relu_0"),
             helper.make_node("Identity", ["b"], ["y"])]
    graph = load_model(make_model(nodes, {"x": [1, 4]}, {"y": [1, 4]}))
    assert [n.name for n in graph.nodes] == ["Relu_0_1", "Relu_0"]   # Identity_2 removed
    nodes[2].name = "Relu_0"
    with raises(ModelError, "Node name 'Relu_0' is used by node #1 and node #2 (ONNX IR: node "
                "names MUST be unique within a graph)"):
        load_model(make_model(nodes, {"x": [1, 4]}, {"y": [1, 4]}))


def test_names_that_are_not_c_identifiers_are_accepted_with_a_warning():
    model = make_model([helper.make_node("MatMul", ["input.1", "fc.weight"], ["/fc/MatMul"],
                                         name="/fc/MatMul"),
                        helper.make_node("Relu", ["/fc/MatMul"], ["out"])],
                       {"input.1": ["batch size", 3]}, {"out": ["batch size", 2]},
                       {"fc.weight": rand(3, 2)})
    graph = check_against_ort(model)
    assert graph.inputs == ("input.1",) and graph.nodes[0].name == "/fc/MatMul"
    assert graph.meta["warnings"] == (
        "4 name(s) do not follow C identifier syntax, e.g. 'input.1', 'fc.weight', "
        "'/fc/MatMul', ...; accepted as they are (ONNX IR: all names MUST adhere to C "
        "identifier syntax)",
        "Dimension variable(s) 'batch size' do not follow C identifier syntax; accepted as "
        "they are (ONNX IR: dimension variable names MUST adhere to C identifier syntax)")


# Optional inputs and outputs ----------------------------------------------------------------

def test_optional_inputs_and_outputs_left_out():
    model = make_model([
        helper.make_node("Conv", ["x", "w", ""], ["c"], name="conv"),         # empty name
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"]),  # trailing
        helper.make_node("Dropout", ["bn", "", ""], ["d", ""], name="drop"),
        helper.make_node("Gemm", ["d", "g"], ["y"], name="fc"),                # C omitted
    ], {"x": [1, 2, 3, 3]}, {"y": [1, 2]},
        {"w": rand(2, 2, 3, 3), "s": rand(2), "b": rand(2), "m": rand(2),
         "v": np.abs(rand(2)) + 1, "g": rand(2, 2)})
    model.graph.node[3].input[:] = ["f", "g"]
    model.graph.node.insert(3, helper.make_node("Flatten", ["d"], ["f"]))
    graph = check_against_ort(model)
    assert [n.op for n in graph.nodes] == ["Conv", "Flatten", "Dense"]


def test_required_input_left_out_breaks_the_signature():
    model = make_model([helper.make_node("Gemm", ["x", ""], ["y"], name="fc")], {"x": [1, 3]},
                       {"y": [1, 3]})
    with raises(ModelError, "Node 'fc' does not fit the signature of Gemm in ai.onnx opset 17: "
                "Node (fc)'s input 1 is marked single but has an empty string in the graph "
                "(ONNX IR: a node's inputs, outputs and attributes MUST satisfy its operator's "
                "signature)"):
        load_model(model)


def test_nodes_no_output_depends_on_are_dropped_before_the_support_check():
    model = make_model([helper.make_node("Softmax", ["x"], ["unused"], name="soft"),
                        helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 3]}, {"y": [1, 3]})
    assert [n.op for n in check_against_ort(model).nodes] == ["Relu"]


# Attributes ---------------------------------------------------------------------------------

def attribute_model(**attr_fields):
    node = helper.make_node("Gemm", ["x", "w"], ["y"], name="fc")
    attr = node.attribute.add()
    for field, value in attr_fields.items():
        if isinstance(value, list):
            getattr(attr, field).extend(value)
        else:
            setattr(attr, field, value)
    return make_model([node], {"x": [1, 3]}, {"y": [1, 2]}, {"w": rand(3, 2)})


@pytest.mark.parametrize("fields, message", [
    (dict(f=1.0, type=onnx.AttributeProto.FLOAT),
     "Node 'fc' has an attribute without a name (ONNX IR: attributes MUST have a name and a "
     "type)"),
    (dict(name="alpha", f=1.0),
     "Attribute 'alpha' of node 'fc' must have a type (ONNX IR: attributes MUST have a name "
     "and a type)"),
    (dict(name="alpha", f=1.0, i=2, type=onnx.AttributeProto.FLOAT),
     "Attribute 'alpha' of node 'fc' has type FLOAT and must carry exactly one value in 'f', "
     "not f, i (ONNX IR: an attribute MUST have only one of the value-carrying properties)"),
    (dict(name="alpha", type=onnx.AttributeProto.FLOAT),
     "Attribute 'alpha' of node 'fc' has type FLOAT and must carry exactly one value in 'f', "
     "not none (ONNX IR: an attribute MUST have only one of the value-carrying properties)"),
    (dict(name="alpha", ref_attr_name="a", type=onnx.AttributeProto.FLOAT),
     "Attribute 'alpha' of node 'fc' refers to function attribute 'a' outside a function body "
     "(ONNX IR: ref_attr_name is only used within a function body)"),
])
def test_malformed_attributes(fields, message):
    with raises(ModelError, message):
        load_model(attribute_model(**fields))


def test_attribute_given_twice():
    model = attribute_model(name="alpha", f=1.0, type=onnx.AttributeProto.FLOAT)
    model.graph.node[0].attribute.append(model.graph.node[0].attribute[0])
    with raises(ModelError, "Attribute 'alpha' of node 'fc' is given twice (ONNX IR: attribute "
                "names MUST be unique for each node)"):
        load_model(model)


def test_unknown_attribute_breaks_the_signature():
    model = attribute_model(name="gamma", f=1.0, type=onnx.AttributeProto.FLOAT)
    with raises(ModelError, "Node 'fc' does not fit the signature of Gemm in ai.onnx opset 17: "
                "Unrecognized attribute: gamma for operator Gemm (ONNX IR: a node's inputs, "
                "outputs and attributes MUST satisfy its operator's signature)"):
        load_model(model)


def test_node_must_have_an_op_type():
    model = relu_model()
    model.graph.node[0].op_type = ""
    with raises(ModelError, "Node 'relu' must have an op_type"):
        load_model(model)
