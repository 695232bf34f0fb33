"""The ONNX frontend refuses what it cannot map, with one-line messages that name the node."""

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from spec_helpers import SUPPORTED

from hwonnx.errors import ModelError, UnsupportedOperatorError
from hwonnx.frontend import load_model

from helpers import raises


def rand(*shape):
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def make_model(nodes, inputs, outputs, inits=None, opset=17, elem=TensorProto.FLOAT,
               opsets=None):
    graph = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info(n, elem, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    return helper.make_model(graph, ir_version=8, opset_imports=opsets or [
        helper.make_opsetid("", opset)])


def relu_model(**kw):
    return make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 4]}, {"y": [1, 4]},
                      **kw)


# Support check --------------------------------------------------------------------------------

def test_all_unsupported_nodes_are_listed_in_one_error():
    model = make_model([
        helper.make_node("Expand", ["x", "index"], ["s"], name="pick"),
        helper.make_node("LSTM", ["s", "w", "r"], ["l"]),
        helper.make_node("Relu", ["l"], ["r1"]),
        helper.make_node("Frobnicate", ["r1"], ["y"], domain="com.example"),
    ], {"x": [1, 4]}, {"y": [1, 4]}, {"w": rand(1, 4, 4), "r": rand(1, 4, 1),
                                      "index": np.array([1, 4], np.int64)},
        opsets=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 3)])
    with raises(UnsupportedOperatorError,
                "3 unsupported node(s): node 'pick' Expand (domain 'ai.onnx', opset 17); "
                "node 'LSTM_1' LSTM (domain 'ai.onnx', opset 17); node 'Frobnicate_3' "
                "Frobnicate (domain 'com.example', opset 3) (Expand 'pick' is folded away, so "
                "its inputs must be constants, but 'x' is computed at run time); "
                f"{SUPPORTED}") as info:
        load_model(model)
    assert info.value.nodes == [("pick", "Expand", "", 17), ("LSTM_1", "LSTM", "", 17),
                                ("Frobnicate_3", "Frobnicate", "com.example", 3)]


def test_supported_op_in_custom_domain_is_unsupported():
    model = make_model([helper.make_node("Relu", ["x"], ["y"], domain="com.example")],
                       {"x": [1, 4]}, {"y": [1, 4]},
                       opsets=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 3)])
    with raises(UnsupportedOperatorError,
                "1 unsupported node(s): node 'Relu_0' Relu (domain 'com.example', opset 3); "
                f"{SUPPORTED}"):
        load_model(model)


def test_operator_of_a_domain_not_imported_is_refused():
    model = make_model([helper.make_node("Relu", ["x"], ["y"], domain="com.example")],
                       {"x": [1, 4]}, {"y": [1, 4]},
                       opsets=[helper.make_opsetid("", 17)])
    with raises(ModelError, "Node 'Relu_0' uses Relu of domain 'com.example', which the model's "
                "opset_import does not import (ONNX IR: each operator used MUST be declared by "
                "an imported operator set)"):
        load_model(model)


def test_support_check_runs_before_shape_inference():
    # Hardmax's input has the wrong rank for Gemm: the user must still hear about Hardmax.
    # (A Softmax there was refused before it ran on the host between segments.)
    model = make_model([helper.make_node("Hardmax", ["x"], ["s"]),
                        helper.make_node("Gemm", ["s", "w"], ["y"])],
                       {"x": [1, 2, 3]}, {"y": [1, 4]}, {"w": rand(3, 4)})
    with pytest.raises(UnsupportedOperatorError, match=r"^1 unsupported node\(s\): node "
                       r"'Hardmax_0' Hardmax \(domain 'ai\.onnx', opset 17\); "
                       r"supported .*$"):
        load_model(model)


def test_conv_group_that_does_not_fit_the_channels_is_refused_by_name():
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], name="dw", group=2)],
                       {"x": [1, 2, 3, 3]}, {"y": [1, 2, 1, 1]}, {"w": rand(2, 2, 3, 3)})
    with raises(ModelError, "Conv 'dw' has group=2, which does not fit its input of 2 channels "
                "and its weight of shape [2, 2, 3, 3] (it needs input channels = group x "
                "weight.shape[1] and output channels divisible by group)"):
        load_model(model)


def test_matmul_of_two_runtime_values_is_unsupported():
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
                       {"a": [1, 3], "b": [3, 2]}, {"y": [1, 2]})
    with raises(UnsupportedOperatorError,
                "1 unsupported node(s): node 'mm' MatMul (domain 'ai.onnx', opset 17) (MatMul "
                "'mm' needs a constant second operand, but 'b' is computed at run time); "
                f"{SUPPORTED}"):
        load_model(model)


def test_foldable_op_on_runtime_value_is_unsupported():
    model = make_model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                        helper.make_node("Expand", ["r", "shape"], ["y"], name="cut")],
                       {"x": [1, 4]}, {"y": [2, 4]}, {"shape": np.array([2, 4], np.int64)})
    with raises(UnsupportedOperatorError,
                "1 unsupported node(s): node 'cut' Expand (domain 'ai.onnx', opset 17) (Expand "
                "'cut' is folded away, so its inputs must be constants, but 'r' is computed "
                f"at run time); {SUPPORTED}"):
        load_model(model)


def test_host_only_op_on_runtime_value_in_the_middle_is_a_host_step():
    # Div on a run-time value after the Relu is no leading chain: it runs on the host between
    # accelerator segments (before, it ran on neither side).
    model = make_model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                        helper.make_node("Div", ["r", "k"], ["y"], name="scale")],
                       {"x": [1, 4]}, {"y": [1, 4]}, {"k": np.float32(2)})
    graph = load_model(model)
    assert graph.meta["host_steps"]["scale"]["at"] == "middle"
    assert [n.op for n in graph.nodes] == ["Relu", "Div"]


# Reading and validation -----------------------------------------------------------------------

def test_missing_file(tmp_path):
    path = tmp_path / "missing.onnx"
    with raises(ModelError, f"Cannot read model '{path}': No such file or directory"):
        load_model(path)


def test_corrupt_file(tmp_path):
    path = tmp_path / "corrupt.onnx"
    path.write_bytes(b"\xff\xff\xff\xffnot a model")
    with raises(ModelError, f"Cannot read model '{path}': it is not an ONNX model (Error "
                "parsing message with type 'onnx.ModelProto': Wire format was corrupt)"):
        load_model(path)


def test_ir_version_too_new():
    model = relu_model()
    model.ir_version = onnx.IR_VERSION + 1
    with raises(ModelError, f"Model ir_version {onnx.IR_VERSION + 1} is newer than "
                f"{onnx.IR_VERSION}, the newest version onnx {onnx.__version__} reads; upgrade "
                f"onnx or re-export the model with ir_version {onnx.IR_VERSION} or older"):
        load_model(model)


def test_ir_version_missing_and_negative():
    model = relu_model()
    model.ClearField("ir_version")
    with raises(ModelError, "Model must set ir_version (ONNX IR: every ModelProto names the IR "
                "version it follows)"):
        load_model(model)
    model.ir_version = -2
    with raises(ModelError, "Model ir_version must be a published IR version (1 to "
                f"{onnx.IR_VERSION}), not -2"):
        load_model(model)


def test_opset_import_rules():
    with raises(ModelError, "Node 'Relu_0' uses Relu of domain 'ai.onnx', which the model's "
                "opset_import does not import (ONNX IR: each operator used MUST be declared by "
                "an imported operator set)"):
        load_model(relu_model(opsets=[helper.make_opsetid("com.example", 1)]))
    with raises(ModelError, "Model opset_import imports domain 'ai.onnx' twice (ONNX IR: "
                "operator set domains must be unique)"):
        load_model(relu_model(opsets=[helper.make_opsetid("", 17),
                                      helper.make_opsetid("ai.onnx", 17)]))
    model = relu_model()
    del model.opset_import[:]
    with raises(ModelError, "Model must have an opset_import (ONNX IR: a model names every "
                "operator set it uses)"):
        load_model(model)


def test_input_must_be_float_tensor_with_shape():
    with raises(ModelError, "Graph input 'x' must be float32, float16, bfloat16 or float64, not "
                "int64"):
        load_model(relu_model(elem=TensorProto.INT64))
    model = relu_model()
    model.graph.input[0].type.tensor_type.ClearField("shape")
    with raises(ModelError, "Graph input 'x' must have a shape (ONNX IR: main graph inputs and "
                "outputs declare at least their rank)"):
        load_model(model)
    model = relu_model()
    model.graph.output[0].type.ClearField("tensor_type")
    with raises(ModelError, "Graph output 'y' must have a tensor type (ONNX IR: main graph "
                "inputs and outputs MUST define their types)"):
        load_model(model)


def test_nodes_not_topologically_sorted():
    model = make_model([helper.make_node("Relu", ["a"], ["y"], name="second"),
                        helper.make_node("Relu", ["x"], ["a"], name="first")],
                       {"x": [1, 4]}, {"y": [1, 4]})
    with raises(ModelError, "Node 'second' reads 'a' before node 'first' defines it (ONNX IR: "
                "nodes must be in topological order)"):
        load_model(model)


def test_value_defined_twice():
    model = make_model([helper.make_node("Relu", ["x"], ["a"], name="one"),
                        helper.make_node("Relu", ["x"], ["a"], name="two"),
                        helper.make_node("Relu", ["a"], ["y"])],
                       {"x": [1, 4]}, {"y": [1, 4]})
    with raises(ModelError, "Value 'a' is defined twice, by node 'one' and by node 'two' (ONNX "
                "IR: single static assignment)"):
        load_model(model)
    model = make_model([helper.make_node("Relu", ["x"], ["w"], name="one")],
                       {"x": [1, 4]}, {"w": [1, 4]}, {"w": rand(1, 4)})
    with raises(ModelError, "Value 'w' is defined twice, by an initializer and by node 'one' "
                "(ONNX IR: single static assignment)"):
        load_model(model)


def test_use_of_undefined_value():
    model = make_model([helper.make_node("Add", ["x", "ghost"], ["y"], name="add")],
                       {"x": [1, 4]}, {"y": [1, 4]})
    with raises(ModelError, "Node 'add' reads 'ghost', which is not a graph input, an "
                "initializer or a node output"):
        load_model(model)


def test_graph_output_never_produced():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 4]},
                       {"y": [1, 4], "z": [1, 4]})
    with raises(ModelError, "Graph output 'z' is never produced (ONNX IR: every graph output "
                "must be defined)"):
        load_model(model)


def test_shape_inference_failure_is_wrapped():
    model = make_model([helper.make_node("Add", ["x", "b"], ["y"], name="add")],
                       {"x": [1, 4]}, {"y": [1, 4]}, {"b": rand(1, 3)})
    with pytest.raises(ModelError, match=r"^Shape inference failed: .*node name: add\).*"
                       r"Incompatible dimensions$"):
        load_model(model)


# Dimension binding and overrides --------------------------------------------------------------

def conv_model():
    return make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                      {"x": ["N", 2, "H", 8]}, {"y": ["N", 3, "H", 8]}, {"w": rand(3, 2, 3, 3)})


def test_unbound_dim_param():
    with raises(ModelError, "Input 'x' has symbolic dimension 'H' at axis 2; give its size "
                "with --input-shape x=1x2xHx8"):
        load_model(conv_model())


def test_input_shape_errors():
    with raises(ModelError, "Input shape given for 'z', which is not an input of the model; "
                "its inputs are x"):
        load_model(conv_model(), input_shapes={"z": (1, 2)})
    with raises(ModelError, "Input shape 1x2x8 given for 'x' must have 4 positive dimensions, "
                "like the model's Nx2xHx8"):
        load_model(conv_model(), input_shapes={"x": (1, 2, 8)})
    with raises(ModelError, "Input shape 1x3x8x8 given for 'x' contradicts the model's "
                "Nx2xHx8 at axis 1"):
        load_model(conv_model(), input_shapes={"x": (1, 3, 8, 8)})


def override_model():
    return make_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                      {"x": [1, 3], "w": [3, 2]}, {"y": [1, 2]}, {"w": rand(3, 2)})


def test_override_shape_mismatch():
    with raises(ModelError, "Override for 'w' must have shape (3, 2) and dtype float32 like "
                "its initializer, not shape (2, 3) and dtype float32"):
        load_model(override_model(), override_initializers={"w": rand(2, 3)})
    with raises(ModelError, "Override for 'w' must have shape (3, 2) and dtype float32 like "
                "its initializer, not shape (3, 2) and dtype float64"):
        load_model(override_model(), override_initializers={"w": np.zeros((3, 2))})


def test_override_unknown_name():
    with raises(ModelError, "Cannot override 'v': it is not a graph input with an initializer; "
                "overridable values are w"):
        load_model(override_model(), override_initializers={"v": rand(3, 2)})


# Supported operators in forms hwonnx cannot map -----------------------------------------------

def test_gemm_trans_a_is_refused():
    model = make_model([helper.make_node("Gemm", ["x", "w"], ["y"], name="fc", transA=1)],
                       {"x": [3, 1]}, {"y": [1, 2]}, {"w": rand(3, 2)})
    with raises(ModelError, "Gemm 'fc' must have transA=0, not transA=1; its run-time operand A "
                "cannot be transposed"):
        load_model(model)


def test_gemm_c_shape_is_checked():
    model = make_model([helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="fc")],
                       {"x": [1, 3]}, {"y": [1, 2]}, {"w": rand(3, 2), "c": rand(1, 1)})
    with raises(ModelError, "Gemm 'fc' must have C of shape [2] or [1, 2], not [1, 1]"):
        load_model(model)


def test_dense_input_must_be_one_row_or_tokens():
    """A MatMul of [1, 2, 4, 3] (two rows of 4 tokens) is neither a row nor tokens (the
    [1, 4, 3] tokens are a 1x1 Conv: tests/frontend/test_tokens.py)."""
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                       {"x": [1, 2, 4, 3]}, {"y": [1, 2, 4, 2]}, {"w": rand(3, 2)})
    with raises(ModelError, "MatMul 'mm' must read a [1, K] row or [1, ..., T, K] tokens "
                "(every axis before the last two of size 1), not [1, 2, 4, 3]; a row maps to "
                "Dense, tokens to a 1x1 Conv over the T tokens"):
        load_model(model)


def test_conv_must_be_1d_or_2d():
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], name="c1")],
                       {"x": [1, 2, 4, 4, 8]}, {"y": [1, 3, 2, 2, 6]}, {"w": rand(3, 2, 3, 3, 3)})
    with raises(UnsupportedOperatorError, "1 unsupported node(s): node 'c1' Conv (domain "
                "'ai.onnx', opset 17) (Conv 'c1' reads 'x' of shape [1, 2, 4, 4, 8]: only a 1-D "
                "([N, C, L]) or 2-D ([N, C, H, W]) convolution maps to the array, not 3-D)"):
        load_model(model)


def test_dropout_mask_must_be_unused():
    model = make_model([helper.make_node("Dropout", ["x"], ["y", "mask"], name="drop")],
                       {"x": [1, 4]}, {"y": [1, 4], "mask": [1, 4]})
    model.graph.output[1].type.tensor_type.elem_type = TensorProto.BOOL
    with raises(ModelError, "Dropout 'drop' output 'mask' (the dropout mask) must be unused; "
                "hwonnx runs inference only"):
        load_model(model)


def test_batchnorm_training_mode_is_refused():
    model = make_model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"],
                                         ["y", "mean", "var"], name="bn", training_mode=1)],
                       {"x": [1, 3, 2, 2]}, {"y": [1, 3, 2, 2]},
                       {"s": rand(3), "b": rand(3), "m": rand(3), "v": rand(3) ** 2})
    with raises(ModelError, "BatchNormalization 'bn' must have training_mode=0, not 1; hwonnx "
                "runs inference only"):
        load_model(model)


def test_conv_bias_must_hold_one_value_per_output_channel():
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv")],
                       {"x": [1, 2, 4, 4]}, {"y": [1, 3, 2, 2]},
                       {"w": rand(3, 2, 3, 3), "b": np.zeros((0, 7, 2, 2, 0), np.float32)})
    with raises(ModelError, "Conv 'conv' has bias 'b' of shape [0, 7, 2, 2, 0]; it must have "
                "shape [3] (one value per output channel)"):
        load_model(model)


def test_batchnorm_parameters_must_hold_one_value_per_channel():
    params = {"s": rand(3), "bb": rand(3), "m": rand(3), "v": np.zeros(0, np.float32)}
    model = make_model([helper.make_node("BatchNormalization", ["x", "s", "bb", "m", "v"], ["y"],
                                         name="bn")],
                       {"x": [1, 3, 2, 2]}, {"y": [1, 3, 2, 2]}, params, opset=13)
    with raises(ModelError, "BatchNormalization 'bn' has input_var 'v' of shape [0]; it must "
                "have shape [3] (one value per channel)"):
        load_model(model)


def test_host_division_by_a_constant_holding_zero_is_refused():
    model = make_model([helper.make_node("Div", ["x", "std"], ["n"], name="norm"),
                        helper.make_node("MatMul", ["n", "w"], ["y"], name="fc")],
                       {"x": [1, 4]}, {"y": [1, 2]},
                       {"std": np.array([1, 0, 2, 1], np.float32), "w": rand(4, 2)})
    with raises(ModelError, "Div 'norm' divides by the constant 'std', which holds 0; the result "
                "would not be finite"):
        load_model(model)


def test_every_refused_form_of_a_supported_operator_is_listed_in_one_error():
    """Two nodes of supported operators in forms hwonnx cannot map (Slices with steps of 2,
    refused by the converter) and a third one after them: one error names both refused nodes,
    with both reasons."""
    i64 = lambda v: np.array(v, np.int64)                               # noqa: E731
    nodes = [helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["c"], name="every_2nd"),
             helper.make_node("Slice", ["c", "s", "e", "a3", "st"], ["d"], name="every_2nd_w"),
             helper.make_node("Relu", ["d"], ["y"], name="relu")]
    model = make_model(nodes, {"x": [1, 2, 4, 4]}, {"y": [1, 2, 2, 2]},
                       {"s": i64([0]), "e": i64([4]), "a": i64([2]), "a3": i64([3]),
                        "st": i64([2])})
    with pytest.raises(UnsupportedOperatorError) as info:
        load_model(model)
    assert [n[0] for n in info.value.nodes] == ["every_2nd", "every_2nd_w"]
    message = str(info.value)
    assert "\n" not in message
    assert "Slice 'every_2nd' has step 2 along axis 2" in message
    assert "Slice 'every_2nd_w' has step 2 along axis 3" in message


def test_transposes_the_array_cannot_copy_are_listed_together():
    """Two Transposes of rank-3 values in the middle of the graph (the array moves the axes of
    [1, C, H, W] images) are refused in one error naming both, not at the first."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu0"),
             helper.make_node("Transpose", ["r"], ["a"], name="t1", perm=[0, 2, 1]),
             helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Transpose", ["b"], ["c"], name="t2", perm=[0, 2, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu2")]
    model = make_model(nodes, {"x": [1, 3, 4]}, {"y": [1, 3, 4]})
    reason = ("Transpose '{}' has perm [0, 2, 1] on a value of shape [1, {}, {}]; the array "
              "moves the channel, height and width axes of a [1, C, H, W] image")
    with raises(UnsupportedOperatorError, "2 unsupported node(s): node 't1' Transpose (domain "
                "'ai.onnx', opset 17); node 't2' Transpose (domain 'ai.onnx', opset 17) ("
                + reason.format("t1", 3, 4) + "; " + reason.format("t2", 4, 3) + ")"):
        load_model(model)


@pytest.mark.parametrize("axis", [1 << 40, (1 << 32) + 1, -(1 << 40)])
def test_flatten_axis_out_of_range_is_refused_by_name(axis, tmp_path, capsys):
    """onnx's shape inference lets a Flatten axis that does not fit in 32 bits through (here
    as axis 0 or 1); the golden model then took a traceback from numpy (ONNX: the axis is in
    [-r, r] for an input of rank r)."""
    from hwonnx.cli import main

    model = make_model([helper.make_node("Flatten", ["x"], ["f"], name="flat", axis=axis),
                        helper.make_node("Gemm", ["f", "w"], ["y"], name="fc")],
                       {"x": [1, 2, 3, 4]}, {"y": [1, 3]}, {"w": rand(24, 3)})
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    message = (f"Flatten 'flat' has axis={axis}, out of range for its rank-4 input 'x' (ONNX: "
               f"axis is in [-r, r] for an input of rank r)")
    with pytest.raises(ModelError, match="^" + re.escape(message) + "$"):
        load_model(model)
    path = tmp_path / "flatten.onnx"
    path.write_bytes(model.SerializeToString())
    assert main(["inspect", str(path)]) == 2
    assert capsys.readouterr().err == f"hwonnx: error: {message}\n"


@pytest.mark.parametrize("axis", [-4, 0, 1])
def test_flatten_axis_in_range_is_read(axis):
    model = make_model([helper.make_node("Flatten", ["x"], ["f"], name="flat", axis=axis),
                        helper.make_node("Gemm", ["f", "w"], ["y"], name="fc")],
                       {"x": [1, 2, 3, 4]}, {"y": [1, 3]}, {"w": rand(24, 3)})
    graph = load_model(model)
    assert graph.types["y"].shape == (1, 3)


def test_the_summary_gives_each_operators_first_reason_first():
    """ShuffleNet: sixteen channel-shuffle Transposes refused before one ReduceMean; the
    ReduceMean's reason must not be cut from the line."""
    from hwonnx.errors import UnsupportedOperatorError
    from hwonnx.frontend.common import summary

    nodes = [(f"t{i}", "Transpose", "", 17) for i in range(16)] + [("r", "ReduceMean", "", 17)]
    reasons = [f"Transpose 't{i}' has perm [0, 2, 1, 3, 4]" for i in range(16)]
    reasons.append("ReduceMean 'r' reduces axes [1]")
    text = summary(UnsupportedOperatorError(nodes), reasons)
    assert text.endswith("(Transpose 't0' has perm [0, 2, 1, 3, 4]; ReduceMean 'r' reduces "
                         "axes [1]; Transpose 't1' has perm [0, 2, 1, 3, 4]; and 14 more)")
