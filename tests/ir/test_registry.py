"""The operator registry (hwonnx/ir/ops.py) is the one place each operator kind is declared:
every stage's code table must cover exactly the registry's entries of its kind, so that adding
an operator to one stage and forgetting another fails here, not in a user's build."""

import numpy as np

from hwonnx.compiler.lower import ARRAY_OPS
from hwonnx.compiler.lowerings import LOWERINGS
from hwonnx.frontend.annotate import Annotations, annotate_graph
from hwonnx.frontend.convert import CONVERTERS
from hwonnx.frontend.host import HOST_CONVERTERS, HOST_END_OPS, HOST_START_OPS, HOST_TOKEN_OPS
from hwonnx.frontend.support import COMPUTE_OPS
from hwonnx.golden.host import HOST_FUNCTIONS
from hwonnx.golden.ops import GOLDEN_OPS, HOST_OPS
from hwonnx.ir import Graph, Node, TensorType
from hwonnx.ir.evaluate import FLOAT_OPS
from hwonnx.ir.ops import (BOUNDARY, FUSED, HOST, IR_OPS, LAYER, LAYOUT, ONNX_OPS, TABLE,
                           integer_ops, ir_ops, onnx_ops)
from hwonnx.ir.tables import TABLE_OPS
from hwonnx.quant.layers import QUANTIZERS


def test_every_mapped_onnx_operator_has_a_converter_and_no_other():
    assert set(CONVERTERS) == onnx_ops(compute=True) | onnx_ops(pair=True)
    assert onnx_ops(compute=True) == COMPUTE_OPS


def test_every_host_step_operator_has_a_host_converter_and_no_other():
    assert set(HOST_CONVERTERS) == HOST_START_OPS | HOST_END_OPS | HOST_TOKEN_OPS


def test_host_only_operators_are_not_mapped():
    """(Sub is host-only with a constant and mapped between two computed tensors.)"""
    for op in onnx_ops(host_only=True, pair=False):
        assert op not in CONVERTERS, op


def test_every_float_op_has_a_float_function():
    # Pad is the one float op without one: fold-pad moves it into the layer after it, and
    # check_fused refuses a Pad left over, so no graph holding one is evaluated.
    evaluated = (ir_ops(LAYER, LAYOUT, TABLE, FUSED) - {"Pad"}) | HOST_OPS
    assert set(FLOAT_OPS) == evaluated
    assert ir_ops(HOST) <= set(HOST_FUNCTIONS)


def test_every_integer_op_has_a_golden_function_and_no_other():
    assert set(GOLDEN_OPS) == set(integer_ops(LAYER, LAYOUT, BOUNDARY)) | HOST_OPS


def test_every_layer_op_has_a_quantizer_and_no_other():
    assert set(QUANTIZERS) == ir_ops(LAYER)


def test_every_integer_layer_op_has_a_lowering_and_no_other():
    assert set(LOWERINGS) == set(integer_ops(LAYER))
    assert set(ARRAY_OPS) == set(LOWERINGS)     # what the compiler accepts


def test_table_operators_are_registered_in_both_vocabularies():
    for op, table in TABLE_OPS.items():
        assert IR_OPS[op].kind == TABLE
        assert (op in ONNX_OPS and ONNX_OPS[op].compute) == table.onnx, op


def test_every_integer_op_says_where_it_runs_and_why():
    for op, entry in IR_OPS.items():
        if entry.quantized:
            assert entry.where in ("hardware", "host") and entry.why, op


def test_constant_inputs_name_existing_positions():
    for op, entry in ONNX_OPS.items():
        assert all(isinstance(i, int) and i >= 1 for i in entry.constant_inputs), op


def test_annotations_mark_every_layer_kind_relu_including_concat():
    """A pre-quantized model's annotated output range starting at real 0 (zero point -128)
    is a ReLU the quantizer removed; a Concat carries relu too (the hand-copied list this
    replaced left it out)."""
    t = TensorType("float32", (1, 2, 2, 2))
    nodes = [Node("cat", "Concat", ("a", "b"), ("c",), {"axis": 1, "relu": False,
                                                       "act_max": None})]
    graph = Graph(nodes, ("a", "b"), ("c",), {"a": t, "b": t,
                                              "c": TensorType("float32", (1, 4, 2, 2))})
    ann = Annotations("qdq", activations={"a": (0.1, -128), "b": (0.1, -128),
                                          "c": (0.1, -128)})
    out = annotate_graph(graph, ann)
    assert out.nodes[0].attrs["relu"] is True
    assert np.isclose(out.meta["quantization"]["activations"]["c"][0], 0.1)
