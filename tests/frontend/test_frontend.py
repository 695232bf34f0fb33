"""The ONNX frontend: each supported operator and form, compared with onnxruntime."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hwonnx.frontend import load_model

from spec_helpers import check_against_ort as spec_check_against_ort
from spec_helpers import make_model

RNG = np.random.default_rng(1234)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def check_against_ort(model, **load_args):
    """Load ``model``, evaluate it and compare every output with onnxruntime (to 1e-4
    relative, 1e-5 absolute)."""
    return spec_check_against_ort(model, rtol=1e-4, atol=1e-5, **load_args)


def ops(graph):
    return [node.op for node in graph.nodes]


@pytest.mark.parametrize("attrs, out_hw", [
    ({"strides": [2, 2], "pads": [1, 1, 1, 1]}, (4, 4)),
    ({"pads": [0, 1, 2, 0]}, (8, 7)),
    ({"dilations": [2, 2], "pads": [2, 2, 2, 2]}, (8, 8)),
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, (4, 4)),
    ({"auto_pad": "SAME_UPPER", "kernel_shape": [3, 3]}, (8, 8)),
    ({"auto_pad": "SAME_LOWER", "strides": [2, 1]}, (4, 8)),
    ({"auto_pad": "VALID", "strides": [1, 2]}, (6, 3)),
])
@pytest.mark.parametrize("bias", [False, True])
def test_conv_matches_onnxruntime(attrs, out_hw, bias):
    inputs = ["x", "w", "b"] if bias else ["x", "w"]
    model = make_model([helper.make_node("Conv", inputs, ["y"], name="conv", **attrs)],
                       {"x": [1, 3, 8, 8]}, {"y": [1, 4, *out_hw]},
                       {"w": rand(4, 3, 3, 3), "b": rand(4)})
    graph = check_against_ort(model)
    (node,) = graph.nodes
    assert node.op == "Conv" and node.name == "conv" and node.outputs == ("y",)
    assert len(node.inputs) == (3 if bias else 2)
    assert set(node.attrs) == {"strides", "pads", "dilations", "group", "relu", "act_max"}
    assert node.attrs["relu"] is False and node.attrs["act_max"] is None
    assert node.attrs["group"] == 1
    assert graph.types["y"].shape == (1, 4, *out_hw)


@pytest.mark.parametrize("auto_pad, pads", [("SAME_UPPER", (1, 1, 2, 2)),
                                            ("SAME_LOWER", (2, 2, 1, 1))])
def test_conv_same_pads_are_explicit(auto_pad, pads):
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], auto_pad=auto_pad)],
                       {"x": [1, 1, 8, 8]}, {"y": [1, 2, 8, 8]}, {"w": rand(2, 1, 4, 4)})
    graph = check_against_ort(model)
    assert graph.nodes[0].attrs["pads"] == pads


@pytest.mark.parametrize("trans_b, alpha, beta, c_shape", [
    (0, 1.0, 1.0, (3,)),
    (1, 1.0, 1.0, (1, 3)),
    (1, 0.5, 2.0, (3,)),
    (0, 1.5, 0.25, (1, 3)),
    (1, 2.0, 1.0, None),
])
def test_gemm_matches_onnxruntime(trans_b, alpha, beta, c_shape):
    w = rand(3, 5) if trans_b else rand(5, 3)
    inputs = ["x", "w", "c"] if c_shape else ["x", "w"]
    model = make_model([helper.make_node("Gemm", inputs, ["y"], transB=trans_b, alpha=alpha,
                                         beta=beta)],
                       {"x": [1, 5]}, {"y": [1, 3]},
                       {"w": w, "c": rand(*(c_shape or (3,)))})
    graph = check_against_ort(model)
    (node,) = graph.nodes
    assert node.op == "Dense" and node.attrs["relu"] is False
    assert len(node.inputs) == (3 if c_shape else 2)
    assert graph.constants[node.inputs[1]].shape == (5, 3)
    if c_shape:
        assert graph.constants[node.inputs[2]].shape == (3,)


def test_matmul_add_becomes_dense_with_bias():
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]),
                        helper.make_node("Add", ["m", "b"], ["y"])],
                       {"x": [1, 6]}, {"y": [1, 4]}, {"w": rand(6, 4), "b": rand(4)})
    graph = check_against_ort(model)
    (node,) = graph.nodes
    assert node.op == "Dense" and node.outputs == ("y",) and len(node.inputs) == 3


def test_constant_first_add_and_relu_fuse():
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]),
                        helper.make_node("Add", ["b", "m"], ["a"]),
                        helper.make_node("Relu", ["a"], ["y"])],
                       {"x": [1, 6]}, {"y": [1, 4]}, {"w": rand(6, 4), "b": rand(1, 4)})
    graph = check_against_ort(model)
    assert ops(graph) == ["Dense"] and graph.nodes[0].attrs["relu"] is True


def test_conv_flatten_gemm_network():
    model = make_model([
        helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "w2", "b2"], ["g"], transB=1),
        helper.make_node("Relu", ["g"], ["y"]),
    ], {"x": [1, 2, 6, 6]}, {"y": [1, 5]},
        {"w1": rand(4, 2, 3, 3), "b1": rand(4), "w2": rand(5, 36), "b2": rand(5)})
    graph = check_against_ort(model)
    assert ops(graph) == ["Conv", "Flatten", "Dense"]
    assert graph.nodes[0].attrs["relu"] and graph.nodes[2].attrs["relu"]
    assert graph.nodes[1].attrs == {"axis": 1}


def test_pytorch_style_flatten_is_folded():
    model = make_model([
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Shape", ["c"], ["shape"]),
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(
            np.array(0, np.int64))),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["batch1"]),
        helper.make_node("Concat", ["batch1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["c", "target"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w2"], ["y"]),
    ], {"x": ["batch", 2, 4, 4]}, {"y": ["batch", 3]},
        {"w": rand(3, 2, 3, 3), "axes": np.array([0], np.int64),
         "minus1": np.array([-1], np.int64), "w2": rand(48, 3)})
    graph = check_against_ort(model)
    assert ops(graph) == ["Conv", "Reshape", "Dense"]
    assert graph.nodes[1].attrs["shape"] == (1, 48)
    assert set(graph.constants) == {"w", "w2"}


def test_reshape_resolves_zero_and_minus_one():
    model = make_model([helper.make_node("Reshape", ["x", "s"], ["y"])],
                       {"x": [1, 2, 3, 4]}, {"y": [1, 2, 12]},
                       {"s": np.array([0, 0, -1], np.int64)})
    graph = check_against_ort(model)
    assert graph.nodes[0].attrs["shape"] == (1, 2, 12)


def test_batchnorm_fused_with_conv_add_relu():
    c = 4
    model = make_model([
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"],
                         epsilon=1e-3),
        helper.make_node("Add", ["bn", "a"], ["sum"]),
        helper.make_node("Relu", ["sum"], ["y"]),
    ], {"x": [1, 3, 5, 5]}, {"y": [1, c, 5, 5]},
        {"w": rand(c, 3, 3, 3), "s": rand(c), "b": rand(c), "m": rand(c),
         "v": np.abs(rand(c)) + 0.5, "a": rand(1, c, 1, 1)})
    graph = check_against_ort(model)
    (node,) = graph.nodes
    assert node.op == "Conv" and node.attrs["relu"] is True and node.outputs == ("y",)
    assert len(node.inputs) == 3 and set(graph.constants) == set(node.inputs[1:])
    assert set(graph.types) == {"x", "y", *node.inputs[1:]}


def test_standalone_batchnorm_becomes_depthwise_conv():
    model = make_model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"],
                                         ["y"])],
                       {"x": [1, 3, 2, 2]}, {"y": [1, 3, 2, 2]},
                       {"s": rand(3), "b": rand(3), "m": rand(3), "v": np.abs(rand(3)) + 0.1})
    graph = check_against_ort(model)
    assert ops(graph) == ["Conv"] and graph.nodes[0].attrs["group"] == 3


def test_batchnorm_after_dense_is_folded():
    model = make_model([
        helper.make_node("Gemm", ["x", "w"], ["g"]),
        helper.make_node("BatchNormalization", ["g", "s", "b", "m", "v"], ["y"]),
    ], {"x": [1, 4]}, {"y": [1, 3]},
        {"w": rand(4, 3), "s": rand(3), "b": rand(3), "m": rand(3), "v": np.abs(rand(3)) + 0.1})
    graph = check_against_ort(model)
    assert ops(graph) == ["Dense"]


def test_identity_and_dropout_are_removed_keeping_output_names():
    model = make_model([
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("Dropout", ["c"], ["d", "mask"]),
        helper.make_node("Identity", ["d"], ["y"]),
    ], {"x": [1, 2, 3, 3]}, {"y": [1, 2, 1, 1]}, {"w": rand(2, 2, 3, 3)})
    graph = check_against_ort(model)
    assert ops(graph) == ["Conv"] and graph.outputs == ("y",) and graph.nodes[0].outputs == ("y",)


def test_identity_of_input_to_output_is_kept():
    model = make_model([helper.make_node("Identity", ["x"], ["y"])], {"x": [1, 3]}, {"y": [1, 3]})
    graph = check_against_ort(model)
    assert ops(graph) == ["Identity"] and graph.inputs == ("x",) and graph.outputs == ("y",)


def test_residual_add_of_two_runtime_values():
    model = make_model([
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Add", ["r", "x"], ["y"]),
    ], {"x": [1, 2, 4, 4]}, {"y": [1, 2, 4, 4]}, {"w": rand(2, 2, 3, 3)})
    graph = check_against_ort(model)
    assert ops(graph) == ["Conv", "Add"] and graph.nodes[1].inputs == ("r", "x")


def test_constant_subgraph_with_mul_sub_div_is_folded():
    model = make_model([
        helper.make_node("Constant", [], ["k"], value_float=2.0),
        helper.make_node("Mul", ["w", "k"], ["w2"]),
        helper.make_node("Sub", ["w2", "k"], ["w3"]),
        helper.make_node("Div", ["w3", "k"], ["w4"]),
        helper.make_node("Cast", ["w4"], ["w5"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["x", "w5"], ["y"]),
    ], {"x": [1, 3]}, {"y": [1, 2]}, {"w": rand(3, 2)})
    graph = check_against_ort(model)
    assert ops(graph) == ["Dense"] and set(graph.constants) == {"w5"}


def test_symbolic_batch_binds_to_one():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ["N", 3]},
                       {"y": ["N", 3]})
    graph = check_against_ort(model)
    assert graph.types["x"].shape == (1, 3) and graph.types["y"].shape == (1, 3)


def test_input_shapes_bind_symbolic_dimensions():
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                       {"x": ["N", 2, "H", "W"]}, {"y": ["N", 3, "H", "W"]},
                       {"w": rand(3, 2, 3, 3)})
    graph = check_against_ort(model, input_shapes={"x": (1, 2, 5, 7)})
    assert graph.types["x"].shape == (1, 2, 5, 7) and graph.types["y"].shape == (1, 3, 5, 7)


def test_same_dim_param_binds_the_same_size():
    model = make_model([helper.make_node("Add", ["a", "b"], ["y"])],
                       {"a": [1, "K"], "b": [1, "K"]}, {"y": [1, "K"]})
    graph = check_against_ort(model, input_shapes={"a": (1, 6)})
    assert graph.types["b"].shape == (1, 6)


def test_initializer_input_is_constant_unless_overridden():
    w = rand(3, 2)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                       {"x": [1, 3], "w": [3, 2]}, {"y": [1, 2]}, {"w": w})
    graph = check_against_ort(model)
    assert graph.inputs == ("x",)
    np.testing.assert_array_equal(graph.constants["w"], w)
    other = rand(3, 2)
    graph = load_model(model, override_initializers={"w": other})
    assert graph.inputs == ("x",)
    np.testing.assert_array_equal(graph.constants["w"], other)


def test_ir3_model_with_every_initializer_as_input():
    inits = {"w": rand(6, 4), "shape": np.array([1, -1], np.int64)}
    model = make_model([helper.make_node("Reshape", ["x", "shape"], ["flat"]),
                        helper.make_node("MatMul", ["flat", "w"], ["y"])],
                       {"x": [1, 2, 3]}, {"y": [1, 4]}, inits)
    model.graph.input.extend([helper.make_tensor_value_info("w", TensorProto.FLOAT, [6, 4]),
                              helper.make_tensor_value_info("shape", TensorProto.INT64, [2])])
    model.ir_version = 3
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("", 8))
    graph = check_against_ort(model)
    assert graph.inputs == ("x",) and graph.meta["ir_version"] == 3
    assert [n.op for n in graph.nodes] == ["Reshape", "Dense"]


def test_float64_model_is_converted_with_a_note():
    model = make_model([helper.make_node("Gemm", ["x", "w", "b"], ["y"])],
                       {"x": [1, 3]}, {"y": [1, 2]},
                       {"w": rand(3, 2).astype(np.float64), "b": rand(2).astype(np.float64)},
                       elem=TensorProto.DOUBLE)
    graph = check_against_ort(model)
    assert graph.meta["notes"] == ("Converted float64 values to float32",)
    assert all(t.dtype == "float32" for t in graph.types.values())
    assert all(c.dtype == np.float32 for c in graph.constants.values())


def test_float16_model_is_converted():
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                       {"x": [1, 3]}, {"y": [1, 2]}, {"w": rand(3, 2).astype(np.float16)},
                       elem=TensorProto.FLOAT16)
    graph = load_model(model)
    assert graph.meta["notes"] == ("Converted float16 values to float32",)
    assert graph.constants["w"].dtype == np.float32


def test_metadata_is_carried():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 2]}, {"y": [1, 2]},
                       producer_name="pytest", producer_version="1.2", model_version=7,
                       doc_string="a test")
    onnx.helper.set_model_props(model, {"model_author": "me"})
    graph = load_model(model)
    assert graph.meta == {
        "ir_version": 8, "opset": 17, "opset_imports": {"ai.onnx": 17},
        "producer_name": "pytest", "producer_version": "1.2", "domain": "", "model_version": 7,
        "doc_string": "a test", "graph_name": "test", "metadata_props": {"model_author": "me"},
        "model_author": "me", "model_license": "",
        "inputs": ({"name": "x", "dtype": "float32", "declared": "1x2", "shape": [1, 2]},),
        "outputs": ({"name": "y", "dtype": "float32", "declared": "1x2", "shape": [1, 2]},),
        "dim_bindings": {}, "notes": (), "warnings": (),
    }


def test_load_from_path_and_bytes_leaves_model_untouched(tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 2]}, {"y": [1, 2]})
    path = tmp_path / "relu.onnx"
    onnx.save(model, path)
    for source in (path, str(path), model.SerializeToString(), model):
        graph = load_model(source)
        assert graph.nodes[0].name == "Relu_0"
    assert model.graph.node[0].name == ""


def test_dead_nodes_are_dropped():
    model = make_model([helper.make_node("Relu", ["x"], ["unused"]),
                        helper.make_node("Identity", ["x"], ["y"])],
                       {"x": [1, 2]}, {"y": [1, 2]})
    assert ops(load_model(model)) == ["Identity"]
