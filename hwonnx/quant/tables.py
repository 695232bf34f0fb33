"""The table activations (``LeakyRelu``, ``Sigmoid``, ``Gelu``, ...:
:data:`hwonnx.ir.tables.TABLE_OPS`) quantized: the 256-entry int8 table of the function,
applied by the post-processor of the layer that writes the activation's input, or by an
identity copy."""

import numpy as np

from ..errors import UnsupportedOperatorError
from ..ir import Graph, Node
from ..ir.evaluate import TABLE_FUNCTIONS
from ..ir.ops import LAYER, integer_ops
from .params import add_constants

__all__ = ["activation_table", "quantize_table"]

#: Integer ops whose post-processing can apply an activation table.
_TABLE_HOSTS = integer_ops(LAYER)


def activation_table(op: str, attrs, in_params, out_params) -> "tuple[int, ...]":
    """The 256 int8 outputs of the elementwise function ``op`` for the int8 inputs -128 ...
    127: dequantized, the function and the quantization in float32, rounding half to even
    (as onnxruntime's DequantizeLinear -> op -> QuantizeLinear computes them). Outside the
    function's domain an infinity saturates and NaN gives -128, as onnxruntime's
    QuantizeLinear does."""
    (s_in, zp_in), (s_out, zp_out) = in_params, out_params
    x = (np.arange(-128, 128) - zp_in).astype(np.float32) * np.float32(s_in)
    with np.errstate(all="ignore"):       # outside the domain: NaN or infinities, saturated
        y = np.asarray(TABLE_FUNCTIONS[op](x, attrs), np.float32)
        q = np.clip(np.rint(y / np.float32(s_out)) + zp_out, -128, 127)
    q[np.isnan(q)] = -128
    return tuple(int(v) for v in q)


def quantize_table(node: Node, graph: Graph, params, qname, nodes, constants, types) -> None:
    """An elementwise activation: a lookup table applied by the post-processor of the layer
    that writes its input, when nothing else reads that value (the layer's output, quantized
    with the input's parameters, becomes the table's index), else by an identity copy (a
    one-source ``QConcat``)."""
    x, out = node.inputs[0], node.outputs[0]
    table = activation_table(node.op, node.attrs, params[x], params[out])
    attrs = {"table": table, "activation": node.op}
    last = nodes[-1] if nodes else None
    readers = graph.consumers(x)
    if last is not None and last.outputs == (qname[x],) and last.op in _TABLE_HOSTS \
            and last.attrs.get("table") is None and x not in graph.outputs \
            and len(readers) == 1 and readers[0] is node:
        del types[qname[x]]
        nodes[-1] = Node(last.name, last.op, last.inputs, (qname[out],),
                         {**last.attrs, **attrs, "table_node": node.name})
        return
    s_in, zp_in = params[x]
    shape = types[qname[x]].shape
    if len(shape) < 2:
        raise UnsupportedOperatorError([(node.name, f"{node.op} on '{x}' of shape {list(shape)} "
                                         f"(the array takes [1, C, H, W] images or [1, K] "
                                         f"vectors)", "", graph.meta.get("opset", 0))])
    channels = shape[1]
    names = add_constants(node.name, {"mult": np.full(channels, 1 << 30, np.int32),
                                      "shift": np.full(channels, 30, np.int32)},
                           constants, types)
    nodes.append(Node(node.name, "QConcat", (qname[x],) + names, (qname[out],),
                      {"zps": (zp_in,), "out_zp": zp_in, "lo": -128, "hi": 127,
                       "scales": (s_in,), "out_scale": s_in, **attrs}))
