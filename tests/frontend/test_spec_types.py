"""ONNX IR conformance, types and shapes: tensor element types (float16/bfloat16/float64
converted, integer and bool constants read, string/complex and newer narrow types refused),
sequence/map/optional/sparse values refused by name, dim_value/dim_param/unknown dimensions
and rank-0 tensors ("Standard data types", "Static tensor shapes")."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hwonnx.errors import ModelError
from hwonnx.frontend import load_model
from hwonnx.ir.evaluate import evaluate_float

from helpers import raises
from spec_helpers import FLOAT, check_against_ort, make_model, rand, relu_model


# Element types ------------------------------------------------------------------------------

@pytest.mark.parametrize("elem, name", [(TensorProto.FLOAT16, "float16"),
                                        (TensorProto.DOUBLE, "float64")])
def test_float16_and_float64_models_are_converted(elem, name):
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    model = make_model([helper.make_node("Gemm", ["x", "w", "b"], ["y"])], {"x": [1, 3]},
                       {"y": [1, 2]}, {"w": rand(3, 2).astype(dtype), "b": rand(2).astype(dtype)},
                       elem=elem)
    graph = load_model(model)
    assert graph.meta["notes"] == (f"Converted {name} values to float32",)
    assert {t.dtype for t in graph.types.values()} == {"float32"}
    if elem == TensorProto.DOUBLE:
        check_against_ort(model)


def test_bfloat16_model_is_converted():
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [1, 2]},
                       {"y": [1, 2]}, elem=TensorProto.BFLOAT16)
    model.graph.initializer.append(helper.make_tensor("w", TensorProto.BFLOAT16, [2, 2],
                                                      [1.5, -2.0, 0.25, 4.0]))
    graph = load_model(model)
    assert graph.meta["notes"] == ("Converted bfloat16 values to float32",)
    assert graph.meta["inputs"][0]["dtype"] == "bfloat16"
    x = np.array([[1.0, 2.0]], np.float32)
    np.testing.assert_array_equal(evaluate_float(graph, {"x": x})["y"], [[2.0, 6.0]])


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                   np.uint32, np.uint64, np.bool_])
def test_integer_and_bool_constants_are_read(dtype):
    model = make_model([helper.make_node("Cast", ["k"], ["c"], to=TensorProto.FLOAT),
                        helper.make_node("Add", ["x", "c"], ["y"])],
                       {"x": [1, 3]}, {"y": [1, 3]},
                       {"k": np.array([[1, 0, 3]]).astype(dtype)})
    graph = check_against_ort(model)
    np.testing.assert_array_equal(graph.constants[graph.nodes[0].inputs[1]],
                                  np.array([[1, 0, 3]]).astype(dtype).astype(np.float32))


@pytest.mark.parametrize("data_type, name", [
    (TensorProto.STRING, "string"), (TensorProto.COMPLEX64, "complex64"),
    (TensorProto.COMPLEX128, "complex128"), (TensorProto.FLOAT8E4M3FN, "float8e4m3fn"),
    (TensorProto.INT4, "int4"), (99, "element type 99"),
])
def test_unreadable_initializer_types_are_refused_by_name(data_type, name):
    model = relu_model()
    model.graph.initializer.append(onnx.TensorProto(name="table", data_type=data_type,
                                                    dims=[1]))
    with raises(ModelError, f"Initializer 'table' has {name}; hwonnx reads only float, integer "
                f"and bool tensors"):
        load_model(model)


@pytest.mark.parametrize("elem, name", [(TensorProto.STRING, "string"),
                                        (TensorProto.COMPLEX64, "complex64")])
def test_unreadable_output_types_are_refused_by_name(elem, name):
    model = relu_model()
    model.graph.output[0].type.tensor_type.elem_type = elem
    with raises(ModelError, f"Graph output 'y' has {name}; hwonnx reads only float, integer "
                f"and bool tensors"):
        load_model(model)


@pytest.mark.parametrize("make_type, kind", [
    (lambda: helper.make_sequence_type_proto(helper.make_tensor_type_proto(FLOAT, [4])),
     "a sequence type"),
    (lambda: helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(
        FLOAT, [])), "a map type"),
    (lambda: helper.make_optional_type_proto(helper.make_tensor_type_proto(FLOAT, [4])),
     "an optional type"),
    (lambda: helper.make_sparse_tensor_type_proto(FLOAT, [4]), "a sparse tensor type"),
])
@pytest.mark.parametrize("where", ["input", "output", "value_info"])
def test_onnx_ml_values_are_refused_by_name(make_type, kind, where):
    model = relu_model()
    value = helper.make_value_info("seq", make_type())
    role = {"input": "Graph input", "output": "Graph output", "value_info": "Value_info entry"}
    getattr(model.graph, where).append(value)
    with raises(ModelError, f"{role[where]} 'seq' has {kind} (ONNX-ML); hwonnx reads only "
                f"tensors"):
        load_model(model)


def test_element_type_outside_the_spec_is_named():
    model = relu_model()
    model.graph.input[0].type.tensor_type.elem_type = 77
    with raises(ModelError, "Graph input 'x' has element type 77; hwonnx reads only float, "
                "integer and bool tensors"):
        load_model(model)


# Shapes -------------------------------------------------------------------------------------

def test_rank_0_tensors():
    model = make_model([helper.make_node("Add", ["x", "k"], ["a"]),
                        helper.make_node("Relu", ["a"], ["y"])],
                       {"x": []}, {"y": []}, {"k": np.float32(-0.5)})
    graph = check_against_ort(model)
    assert graph.types["x"].shape == () and graph.constants["k"].shape == ()
    assert graph.meta["inputs"][0]["declared"] == "scalar"


def test_unknown_leading_dimension_binds_to_one():
    graph = check_against_ort(make_model([helper.make_node("Relu", ["x"], ["y"])],
                                         {"x": [None, 4]}, {"y": [None, 4]}))
    assert graph.types["x"].shape == (1, 4) and graph.meta["inputs"][0]["declared"] == "?x4"


def test_unknown_inner_dimension_must_be_given():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, None]},
                       {"y": [1, None]})
    with raises(ModelError, "Input 'x' has symbolic dimension (unnamed) at axis 1; give its "
                "size with --input-shape x=1x?"):
        load_model(model)
    graph = check_against_ort(model, input_shapes={"x": (1, 5)})
    assert graph.types["y"].shape == (1, 5)


def test_dim_param_binds_one_size_everywhere():
    model = make_model([helper.make_node("Add", ["a", "b"], ["y"])],
                       {"a": ["N", "K"], "b": ["N", "K"]}, {"y": ["N", "K"]})
    graph = check_against_ort(model, input_shapes={"b": (1, 7)})
    assert graph.types["a"].shape == graph.types["y"].shape == (1, 7)
    assert graph.meta["dim_bindings"] == {"K": 7, "N": 1}
    with raises(ModelError, "Dimension 'K' is given two sizes, 7 and 8, in input shapes"):
        load_model(model, input_shapes={"a": (1, 7), "b": (1, 8)})


def test_dim_param_bound_in_inputs_is_checked_in_outputs():
    model = make_model([helper.make_node("Flatten", ["x"], ["y"], axis=0)],
                       {"x": ["N", 3]}, {"y": [1, "N"]})
    with pytest.raises(ModelError, match=r"^Shape inference failed: .*node name: Flatten_0\).*"
                       r"Inferred shape and existing shape differ in dimension 1: \(3\) vs "
                       r"\(1\)$"):
        load_model(model)


def test_negative_dimension_is_refused():
    model = relu_model()
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = -4
    with raises(ModelError, "Graph input 'x' has size -4 at axis 1; sizes must be non-negative"):
        load_model(model)


def test_absurd_input_size_is_refused_before_any_allocation():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 1 << 20, 1 << 20]},
                       {"y": [1, 1 << 20, 1 << 20]})
    with raises(ModelError, "Input 'x' has shape 1x1048576x1048576, 1099511627776 elements, "
                "more than hwonnx's limit of 268435456"):
        load_model(model)


def test_absurd_initializer_dims_are_refused():
    model = relu_model()
    model.graph.initializer.append(onnx.TensorProto(name="w", data_type=TensorProto.FLOAT,
                                                    dims=[1 << 40], raw_data=b"\0" * 8))
    with raises(ModelError, "Initializer 'w' has 1099511627776 elements (dims [1099511627776]), "
                "more than hwonnx's limit of 268435456 elements or 1073741824 bytes"):
        load_model(model)


def test_initializer_data_must_fit_its_dims():
    model = relu_model()
    model.graph.initializer.append(numpy_helper.from_array(rand(2, 3), "w"))
    model.graph.initializer[0].dims[:] = [4, 3]
    with raises(ModelError, "Initializer 'w' has 24 bytes of raw_data, but its dims [4, 3] "
                "need 48"):
        load_model(model)
    model.graph.initializer[0].CopyFrom(onnx.TensorProto(name="w", data_type=FLOAT, dims=[4],
                                                         float_data=[1.0, 2.0]))
    with raises(ModelError, "Initializer 'w' has 2 values in float_data, but its dims [4] "
                "need 4"):
        load_model(model)
