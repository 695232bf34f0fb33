"""A ``BatchNormalization`` after a layer whose integer weights a pre-quantized model gives
(Brevitas' QCDQ export: ``Conv`` on ``DequantizeLinear`` of int8 weights, then a
``BatchNormalization`` the export leaves float), folded into the layer's weight scales so that
the integers stay the model's. The float pass ``fold-batchnorm`` would fold it into the float
weights instead, which then no longer equal the recorded integers times their scale: hwonnx
quantized them again from float (measured on the corpus' ``brevitas_cnn_w4a4_qcdq``: five
times further from the reference than the same network's QONNX export, whose import folds
the same way as here, :meth:`.qonnx_layers.QonnxLayerRewrites.fold_batchnorm`)."""

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .annotate import Annotations, IntegerConstant
from .common import ReadLog, fresh_name, is_default_domain

__all__ = ["fold_integer_batchnorm"]


def fold_integer_batchnorm(model: onnx.ModelProto, ann: Annotations, rlog: ReadLog) -> None:
    """Fold (in place) each ``BatchNormalization`` of constant parameters that alone reads the
    unquantized output of a ``Conv`` (any group) or ``Gemm`` (``transA = 0``, ``alpha =
    beta = 1``, no ``transB``: the import has transposed the weight) whose weight is an int8
    integer constant of ``ann`` with zero point 0, per tensor or per output channel. Per
    output channel ``a = gamma / sqrt(var + eps)``: the weight scale becomes ``|a| * s_w``
    (float32), the integers ``sign(a) * q``, the bias the float ``a * (b - mean) + beta``. A
    channel whose folded scale underflows float32 keeps its scale and integers 0 (its bias
    alone). Weights of at most 63 in magnitude are then held as ``q * 2^k`` with scale
    ``s / 2^k`` (``|q| * 2^k <= 127``: the same real weights), so that the float bias rounds
    to a ``2^k`` times finer accumulator grid, as the QONNX import does."""
    graph = model.graph
    consts = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    readers: "dict[str, int]" = {}
    for node in graph.node:
        for value in node.input:
            readers[value] = readers.get(value, 0) + 1
    outputs = {v.name for v in graph.output}
    producer = {out: n for n in graph.node for out in n.output}
    taken = set(consts) | {v.name for v in graph.input} | set(producer)
    dropped, added = set(), {}
    for bn in graph.node:
        if bn.op_type != "BatchNormalization" or not is_default_domain(bn.domain) or \
                len(bn.input) != 5 or len(bn.output) != 1 or \
                any(v not in consts for v in bn.input[1:]):
            continue
        layer = producer.get(bn.input[0])
        if layer is None or not is_default_domain(layer.domain) or \
                layer.op_type not in ("Conv", "Gemm") or len(layer.input) < 2 or \
                readers.get(bn.input[0]) != 1 or bn.input[0] in outputs or \
                bn.input[0] in ann.activations or readers.get(layer.input[1]) != 1:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in layer.attribute}
        if layer.op_type == "Gemm" and (attrs.get("transA", 0) or attrs.get("transB", 0) or
                                        attrs.get("alpha", 1.0) != 1.0 or
                                        attrs.get("beta", 1.0) != 1.0):
            continue
        record = ann.integers.get(layer.input[1])
        out_axis = 0 if layer.op_type == "Conv" else 1
        if record is None or record.bits != 8 or np.any(record.zero_point != 0) or \
                record.axis not in (None, out_axis):
            continue
        channels = record.q.shape[out_axis]
        gamma, beta, mean, var = (consts[v].astype(np.float64).reshape(-1)
                                  for v in bn.input[1:])
        if any(p.size != channels for p in (gamma, beta, mean, var)):
            continue
        bias_name = layer.input[2] if len(layer.input) > 2 else ""
        if bias_name and (bias_name not in consts or readers.get(bias_name) != 1):
            continue
        bias = consts[bias_name].astype(np.float64).reshape(-1) if bias_name \
            else np.zeros(channels)
        eps = float(next((helper.get_attribute_value(a) for a in bn.attribute
                          if a.name == "epsilon"), 1e-5))
        a = gamma / np.sqrt(var + eps)
        s_w = np.broadcast_to(record.scale.astype(np.float64).reshape(-1), (channels,))
        folded = (s_w * np.abs(a)).astype(np.float32)
        dead = folded < np.finfo(np.float32).tiny
        scale = np.where(dead, s_w, folded).astype(np.float32)
        shape = [1] * record.q.ndim
        shape[out_axis] = -1
        q = record.q.astype(np.int64) * np.where(dead, 0, np.where(a < 0, -1, 1)).reshape(shape)
        largest = int(np.abs(q).max(initial=0))
        if 0 < largest <= 63:
            factor = 2 ** int(np.floor(np.log2(127 / largest)))
            widened = (scale / np.float32(factor)).astype(np.float32)
            if np.all(widened >= np.finfo(np.float32).tiny):
                q, scale = q * factor, widened
        value = q.astype(np.float32) * scale.reshape(shape)
        w_name = fresh_name(taken, f"{layer.input[1]}_batchnorm")
        b_name = fresh_name(taken, f"{layer.name}_bias_batchnorm")
        added[w_name] = value
        added[b_name] = (a * (bias - mean) + beta).astype(np.float32)
        ann.integers[w_name] = IntegerConstant(q.astype(np.int8), np.zeros(channels, np.int8),
                                               scale, out_axis, value, 8)
        inputs = [layer.input[0], w_name, b_name]
        del layer.input[:]
        layer.input.extend(inputs)
        layer.output[0] = bn.output[0]
        dropped.add(id(bn))
        rlog.note(f"BatchNormalization '{bn.name}' folded into the weight scales and bias of "
                  f"{layer.op_type} '{layer.name}', whose integer weights stay the model's")
    if not dropped:
        return
    kept = [n for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in added.items())
