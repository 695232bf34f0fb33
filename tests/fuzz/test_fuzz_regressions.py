"""Regression tests for the failure classes the slow tier of ``test_fuzz_build`` found, each
the fuzzer's shrunk case (or the smallest mutation of a seed model that reproduced it): every
one now ends in a one-line hwonnx error naming the node or value, with no warning (warnings
are errors in the suite) and no other exception."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tests.fuzz.test_fuzz_build import classify

from hwonnx.api import build
from hwonnx.errors import HwonnxError, ModelError, QuantizationError, UnsupportedOperatorError
from hwonnx.frontend import load_model

from fuzz_cases import mutated, random_feeds

# (seed, mutations, outcome, error type, words the message names)
CASES = {
    # IndexError in frontend/prequant.py: a QDQ QuantizeLinear or Relu without inputs
    "QuantizeLinear-without-inputs": (
        "qdq", [("io", 24, "input", 44, "drop", 11)] * 3, "refused at load", ModelError,
        ["QuantizeLinear 'q_y'", "needs at least 2 inputs"]),
    "QDQ-Relu-without-input": (
        "qdq", [("io", 31, "input", 3, "drop", 8)], "refused at load", ModelError,
        ["'relu'", "input size 0"]),
    # ValueError in prequant.py: an empty initializer whose other dims overflow numpy's index
    "empty-initializer-huge-dims": (
        "qdq", [("init_raw", 3, b""), ("init_dims", 3, [(1 << 63) - 1, 7, 0], False)],
        "refused at load", ModelError, ["'xq_s'", "non-zero dims"]),
    # ValueError in quant/host.py: the host suffix reads the host prefix, no accelerator node
    "host-steps-only": (
        "mlp", [("io", 21, "input", 52, "other", 12)], "refused at build",
        UnsupportedOperatorError, ["'sub'", "no node for the accelerator"]),
    # ValueError in ir/evaluate.py: a Squeeze dropping the batch axis, during calibration
    # (since an Add of two shapes goes to the element-wise engine, refused when loading)
    "Squeeze-drops-batch-axis": (
        "residual", [("op_type", 49, "Squeeze")], "refused at load",
        UnsupportedOperatorError, ["Add 'residual'", "[8, 6, 6]", "[1, 8, 6, 6]"]),
    # ValueError in ir/evaluate.py: a rank-0 graph input (of a QDQ model without outputs)
    "rank-0-input": (
        "qdq", [("shape_run", "input", 1, 0, 1), ("graph_io", "drop_output", 35)],
        "refused at build", ModelError, ["input 'x'", "shape []"]),
    # a wrong result (golden/host.py): a 4-axis perm on a 5-D input; onnx's
    # ReferenceEvaluator refuses it too ("Inconsistent permutation")
    "Transpose-perm-shorter-than-rank": (
        "residual", [("shape", "input", 2, -1, 2)], "refused at load", ModelError,
        ["Transpose 'nhwc'", "[0, 3, 1, 2]", "5 axes"]),
    # RuntimeWarnings: float32 overflow in calibration (ir/evaluate.py), a negative variance
    # (passes/fold_batchnorm.py), a dequantized weight beyond float32 (prequant.py), a host
    # Div by a subnormal (golden/host.py), an activation scale of 1e-45 (quant/ptq.py)
    "Conv-overflows-float32": (
        "cnn", [("init_values", 2, [3.4e38] * 4)], "refused at build", QuantizationError,
        ["Node 'conv1'", "inf or NaN"]),
    "Gemm-overflows-float32": (
        "cnn", [("init_values", 9, [3.4e38] * 4)], "refused at build", QuantizationError,
        ["Node 'fc'", "inf or NaN"]),
    "AvgPool-overflows-float32": (
        "cnn", [("init_values", 6, [3.4e38] * 4)], "refused at build", QuantizationError,
        ["Node 'avg'", "inf or NaN"]),
    "negative-BatchNorm-variance": (
        "cnn", [("init_values", 8, [-1.0])], "refused at load", ModelError,
        ["BatchNormalization 'bn'", "variance + epsilon"]),
    "BatchNorm-folds-beyond-float32": (
        "cnn", [("init_values", 7, [3.4e38] * 4)], "refused at load", ModelError,
        ["BatchNormalization 'bn'", "beyond float32"]),
    "dequantized-weight-beyond-float32": (
        "qdq", [("init_values", 9, [3.4e38])], "refused at load", ModelError,
        ["DequantizeLinear 'dq_cw'", "beyond float32"]),
    "host-Div-by-subnormal": (
        "mlp", [("init_values", 1, [1e-45])], "refused at load", ModelError,
        ["Div 'div'", "1.4013e-45", "reciprocal overflows"]),
    "subnormal-activation-scale": (
        "qdq", [("init_values", 5, [1e-45])], "refused at build", QuantizationError,
        ["Layer 'conv'", "requantization scale"]),
}


def _error(data: bytes) -> HwonnxError:
    """The hwonnx error loading or building ``data`` raises (with calibration data)."""
    try:
        graph = load_model(data)
        build(data, None, calib=random_feeds(graph, np.random.default_rng(0), 4), verilog=False,
              log=lambda message: None)
    except HwonnxError as error:
        return error
    raise AssertionError("the model loaded and built")


@pytest.mark.parametrize("name", list(CASES))
def test_found_by_the_slow_tier(name):
    seed_name, mutations, outcome, kind, words = CASES[name]
    data = mutated(seed_name, mutations)
    assert classify(data) == (outcome, None, "")
    error = _error(data)
    assert type(error) is kind, error
    text = str(error)
    assert "\n" not in text and all(word in text for word in words), text


def test_constant_graph_output_is_refused():
    """A graph output that does not depend on the input (``y = Relu(w)`` beside
    ``z = Gemm(x, w)``; a KeyError in quant/ptq.py) is refused by name at build."""
    n = helper.make_node
    w = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    graph = helper.make_graph(
        [n("Gemm", ["x", "w"], ["z"], name="fc"), n("Relu", ["w"], ["y"], name="r")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 3]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
        [numpy_helper.from_array(w, "w")])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                             ir_version=8).SerializeToString()
    assert classify(data) == ("refused at build", None, "")
    error = _error(data)
    assert isinstance(error, ModelError) and "Graph output 'y' is a constant" in str(error)


def test_table_activation_on_a_rank_1_input_is_refused():
    """A ``Tanh`` straight on a graph input of shape [1] (an IndexError in quant/tables.py's
    table placement) is refused by name at build."""
    n = helper.make_node
    graph = helper.make_graph(
        [n("Tanh", ["x"], ["y"], name="tanh")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                             ir_version=8).SerializeToString()
    assert classify(data) == ("refused at build", None, "")
    error = _error(data)
    assert isinstance(error, UnsupportedOperatorError) and "'tanh' Tanh on 'x'" in str(error)
