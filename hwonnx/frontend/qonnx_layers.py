"""The layer-level rewrites of the QONNX import (:mod:`.qonnx`): channels-last operators as
their NCHW twins, a BatchNormalization folded into the layer before it, bipolar activations as
a layer's sign, low-bit weights widened for a float bias, ReLUs that a quantizer's clamp makes
redundant; and the names shared with :mod:`.qonnx`."""

import numpy as np
import onnx
from onnx import helper

from ..errors import ModelError
from .common import is_default_domain
from .shapes import shape_skeleton

__all__ = ["QONNX_DOMAINS", "CHANNELS_LAST_DOMAIN", "KNOWN_DOMAINS", "RANGES_OF",
           "QonnxLayerRewrites", "cancel_transposes", "bounds", "label", "attrs_of"]

#: Domains of the QONNX quantizers (``onnx.brevitas``: Brevitas' exports; ``finn...``: FINN's).
QONNX_DOMAINS = frozenset({"qonnx.custom_op.general", "onnx.brevitas",
                           "finn.custom_op.general"})
CHANNELS_LAST_DOMAIN = "qonnx.custom_op.channels_last"
KNOWN_DOMAINS = QONNX_DOMAINS | {CHANNELS_LAST_DOMAIN}
_CHANNELS_LAST_OPS = ("Conv", "MaxPool", "BatchNormalization")
_NCHW, _NHWC = [0, 3, 1, 2], [0, 2, 3, 1]
#: Operators that only relabel the axes of their input.
_LAYOUT = ("Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity")
#: Operators whose output holds values of their input (on its quantization grid).
_ON_GRID = ("Relu", "MaxPool", "Flatten", "Reshape", "Transpose", "Identity", "Squeeze",
            "Unsqueeze", "Resize", "Upsample", "DepthToSpace")


def label(node: onnx.NodeProto) -> str:
    return f"{node.op_type} '{node.name}'"


def attrs_of(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def bounds(signed: bool, narrow: bool, bits: int) -> "tuple[int, int]":
    """qonnx's ``min_int``/``max_int``."""
    if signed:
        return -(2 ** (bits - 1)) + int(narrow), 2 ** (bits - 1) - 1
    return 0, 2 ** bits - 1 - int(narrow)


RANGES_OF = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}


class QonnxLayerRewrites:
    """Methods of the QONNX rewriter (:class:`.qonnx._QonnxRewriter`) that rewrite layers;
    they use its ``consts``, ``const``, ``fresh``, ``params``, ``rlog`` ..."""

    def channels_last(self, node: onnx.NodeProto) -> "list[onnx.NodeProto]":
        if node.op_type not in _CHANNELS_LAST_OPS or len(node.output) != 1:
            raise ModelError(f"{label(node)} of domain '{node.domain}' is not supported; "
                             f"hwonnx reads the channels-last Conv, MaxPool and "
                             f"BatchNormalization")
        x_nchw = self.fresh(f"{node.input[0]}_nchw")
        y_nchw = self.fresh(f"{node.output[0]}_nchw")
        inputs = [x_nchw, *node.input[1:]]
        nodes = [helper.make_node("Transpose", [node.input[0]], [x_nchw], perm=_NCHW,
                                  name=self.fresh(f"{node.name}_to_nchw"))]
        if node.op_type == "Conv":
            inputs[1] = self.nchw_weight(node)
        twin = helper.make_node(node.op_type, inputs, [y_nchw], name=node.name)
        twin.attribute.extend(node.attribute)
        nodes += [twin, helper.make_node("Transpose", [y_nchw], [node.output[0]], perm=_NHWC,
                                         name=self.fresh(f"{node.name}_to_nhwc"))]
        return nodes

    def nchw_weight(self, node: onnx.NodeProto) -> str:
        """The name of the channels-last Conv's weight ``[M, KH, KW, C]`` in ONNX's layout
        ``[M, C, KH, KW]``: a transposed copy of a constant, or of the constant a weight
        quantizer reads (whose per-channel scale is along axis 0 either way)."""
        weight = node.input[1] if len(node.input) > 1 else ""
        if weight in self.consts and self.consts[weight].ndim == 4:
            return self.const(self.consts[weight].transpose(_NCHW), f"{weight}_nchw")
        producer = next((n for n in self.graph.node if weight in n.output), None)
        if producer is not None and producer.domain in QONNX_DOMAINS and \
                producer.op_type in ("Quant", "IntQuant", "BipolarQuant") and \
                producer.input[0] in self.consts and self.consts[producer.input[0]].ndim == 4:
            inputs = list(producer.input)
            inputs[0] = self.const(self.consts[producer.input[0]].transpose(_NCHW),
                                   f"{producer.input[0]}_nchw")
            scale = self.consts.get(producer.input[1])
            if scale is not None and scale.ndim == 4:
                inputs[1] = self.const(scale.transpose(_NCHW), f"{producer.input[1]}_nchw")
            out = self.fresh(f"{weight}_nchw")
            copy = helper.make_node(producer.op_type, inputs, [out], domain=producer.domain,
                                    name=self.fresh(f"{producer.name}_nchw"))
            copy.attribute.extend(producer.attribute)
            self.extra.append(copy)
            return out
        raise ModelError(f"{label(node)} (channels last) needs a constant 4-D weight or a "
                         f"quantizer of one, but '{weight}' is neither")

    # -- quantizers -----------------------------------------------------------------------
    def requantize_input(self, node: onnx.NodeProto) -> "list[onnx.NodeProto]":
        """When another activation quantizer writes the input of the activation quantizer
        ``node`` (a tensor quantized twice, Brevitas' ``QuantIdentity`` after a quantized
        activation), directly or through operators that keep its grid (:data:`_ON_GRID`: a
        ``MaxPool``, ``Flatten``, ...), a copy of that input for ``node`` to read: a
        depthwise 1x1 ``Conv`` of integer weights 1 (scale 1, no bias), which the array
        requantizes from the first quantizer's grid to ``node``'s:
        ``q2 = clamp(round(q1 * s1 / s2))``. The tensor itself keeps the first quantizer's
        grid for its other readers. A ``[N, C, H, W]`` tensor that ``Flatten``/``Reshape``/
        ``Squeeze``/``Unsqueeze`` nodes make 2- or 3-D is copied before them (the copies of
        those nodes then read the copy: quantization per tensor commutes with them); a ``[N,
        C]`` or ``[N, C, L]`` tensor otherwise is reshaped to 4-D around the copy. Returns
        the new nodes (none otherwise) and makes ``node`` read the copy."""
        x = node.input[0]
        source = self.quantized_source(x, self.producers)
        if source is None or self.same_quantizer(source, node):
            return []
        chain = []                      # layout nodes from a 4-D tensor to x, last first
        value = x
        while len(self.value_shape(value) or ()) != 4:
            producer = self.producers.get(value)
            if producer is None or not is_default_domain(producer.domain) or \
                    producer.op_type not in _LAYOUT or not producer.input:
                chain, value = [], x
                break
            chain.append(producer)
            value = producer.input[0]
        shape = self.value_shape(value)
        if shape is None or not 2 <= len(shape) <= 4 or not isinstance(shape[1], int):
            raise ModelError(f"{label(node)} requantizes '{x}', which {label(source)} "
                             f"quantizes, but its shape is {shape or 'unknown'}; hwonnx "
                             f"requantizes a [N, C], [N, C, L] or [N, C, H, W] tensor of known "
                             f"channels")
        channels, rank = shape[1], len(shape)
        base = f"{node.name}_requantized"
        nodes = []
        if rank < 4:
            flat = self.fresh(f"{value}_4d")
            nodes.append(helper.make_node("Reshape", [value, self.const(np.array(
                [0, -1, 1, 1] if rank == 2 else [0, 0, -1, 1], np.int64), f"{base}_shape")],
                [flat], name=self.fresh(f"{base}_to_4d")))
            value = flat
        weight = self.fresh(f"{base}_weight")
        nodes.append(self.dequantize_named(np.ones((channels, 1, 1, 1), np.int8),
                                           np.float32(1), weight))
        out = self.fresh(base)
        nodes.append(helper.make_node("Conv", [value, weight], [out], group=channels,
                                      kernel_shape=[1, 1], name=self.fresh(f"{base}_copy")))
        if rank < 4:
            back = self.fresh(f"{base}_{rank}d")
            nodes.append(helper.make_node("Reshape", [out, self.const(np.array(
                [0, -1] if rank == 2 else [0, 0, -1], np.int64), f"{base}_back")],
                [back], name=self.fresh(f"{base}_to_{rank}d")))
            out = back
        for layout in reversed(chain):
            copy = onnx.NodeProto()
            copy.CopyFrom(layout)
            copy.name = self.fresh(f"{layout.name}_{base}")
            copy.input[0] = out
            out = self.fresh(f"{layout.output[0]}_{base}")
            copy.output[0] = out
            nodes.append(copy)
        node.input[0] = out
        self.rlog.note(f"'{source.output[0]}' is quantized by {label(source)} and again by "
                       f"{label(node)}: {label(node)} reads a copy requantized on the array")
        return nodes

    def same_quantizer(self, first: onnx.NodeProto, second: onnx.NodeProto) -> bool:
        """Whether ``second`` quantizes as ``first`` does (the same operator, attributes and
        constant parameters): then it changes no value on ``first``'s grid."""
        def params(node):
            return [self.consts.get(v) for v in node.input[1:]]
        if first.op_type != second.op_type or attrs_of(first) != attrs_of(second) or \
                len(first.input) != len(second.input):
            return False
        return all(a is not None and b is not None and a.shape == b.shape and
                   np.array_equal(a, b) for a, b in zip(params(first), params(second)))

    def quantized_source(self, value: str, producers: dict) -> "onnx.NodeProto | None":
        """The activation quantizer that writes ``value``, directly or through operators
        that keep its grid (:data:`_ON_GRID`), or None."""
        source = producers.get(value)
        while source is not None and is_default_domain(source.domain) and \
                source.op_type in _ON_GRID and source.input:
            source = producers.get(source.input[0])
        if source is None or source.domain not in QONNX_DOMAINS or source.op_type not in (
                "Quant", "IntQuant", "BipolarQuant") or source.input[0] in self.consts:
            return None
        return source

    def value_shape(self, value: str) -> "list | None":
        """The shape of ``value`` in the model as read (:meth:`infer_shapes`), or None."""
        return (self.shapes or {}).get(value)

    def infer_shapes(self) -> None:
        """``self.shapes``: value -> shape (None for an unknown dimension) by ONNX shape
        inference on a copy of the model as read, its QONNX quantizers as ``Identity``
        nodes, when some quantizer reads another's output (:meth:`quantized_source`; else
        None)."""
        producers = {out: n for n in self.graph.node for out in n.output}
        self.shapes = None
        if any(n.domain in QONNX_DOMAINS and n.input and
               self.quantized_source(n.input[0], producers) is not None
               for n in self.graph.node):
            model = shape_skeleton(self.model)[0]
            for node in model.graph.node:
                if node.domain in QONNX_DOMAINS and node.input:
                    inputs = node.input[:1]
                    del node.input[:]
                    node.input.extend(inputs)
                    del node.attribute[:]
                    node.op_type, node.domain = "Identity", ""
            try:
                model = onnx.shape_inference.infer_shapes(model, data_prop=True)
            except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError,
                    RuntimeError):       # then no shapes: the requantization refuses by name
                model = None
            self.shapes = {} if model is None else {
                v.name: [d.dim_value if d.HasField("dim_value") else None
                         for d in v.type.tensor_type.shape.dim]
                for v in (*model.graph.input, *model.graph.value_info, *model.graph.output)
                if v.type.tensor_type.HasField("shape")}

    def fold_batchnorm(self, nodes: "list[onnx.NodeProto]", weights: dict
                       ) -> "list[onnx.NodeProto]":
        """Fold each ``BatchNormalization`` that alone reads a ``Conv``/``Gemm`` with quantized
        weights into the layer: per output channel ``a = gamma / sqrt(var + eps)``, the weight
        scale becomes ``|a| * s_w`` and the integers ``sign(a) * q`` (so they stay the model's),
        the bias ``a * (b - mean) + beta``. The normalization is then part of the layer's
        requantization to the quantizer after it."""
        readers: "dict[str, int]" = {}
        for node in nodes:
            for value in node.input:
                readers[value] = readers.get(value, 0) + 1
        outputs = {v.name for v in self.graph.output}
        producer = {n.output[0]: n for n in nodes if n.output}
        dropped, renamed = set(), {}
        for bn in nodes:
            if bn.op_type != "BatchNormalization" or not is_default_domain(bn.domain) or \
                    len(bn.input) != 5 or len(bn.output) != 1 or \
                    any(v not in self.consts for v in bn.input[1:]):
                continue
            layer = producer.get(bn.input[0])
            if layer is None or not is_default_domain(layer.domain) or \
                    layer.op_type not in ("Conv", "Gemm") or len(layer.input) < 2 or \
                    layer.input[1] not in weights or readers.get(layer.input[1]) != 1 or \
                    readers.get(bn.input[0]) != 1 or bn.input[0] in outputs:
                continue
            attrs = attrs_of(layer)
            if layer.op_type == "Gemm" and (attrs.get("transA", 0) or attrs.get("alpha", 1.0)
                                            != 1.0 or attrs.get("beta", 1.0) != 1.0):
                continue
            q, scale, axis, quant = weights[layer.input[1]]
            out_axis = 0 if layer.op_type == "Conv" or attrs.get("transB", 0) else 1
            if axis not in (None, out_axis):
                continue
            gamma, beta, mean, var = (self.consts[v].astype(np.float64).reshape(-1)
                                      for v in bn.input[1:])
            eps = float(attrs_of(bn).get("epsilon", 1e-5))
            channels = q.shape[out_axis]
            if gamma.size != channels:
                continue
            a = gamma / np.sqrt(var + eps)
            bias = layer.input[2] if len(layer.input) > 2 else ""
            if bias in weights:                 # a quantized bias: the value qonnx computes
                b_q, b_scale, b_axis, _ = weights[bias]
                bias = (b_q.astype(np.float32) * b_scale.reshape(
                    (-1,) if b_axis is not None else ())).astype(np.float64)
            elif bias in self.consts:
                bias = self.consts[bias].astype(np.float64).reshape(-1)
            elif not bias:
                bias = np.zeros(channels)
            else:
                continue
            s_w = np.broadcast_to(scale.astype(np.float64).reshape(-1), (channels,))
            shape = [1] * q.ndim
            shape[out_axis] = -1
            # a channel whose scale underflows float32 (a dead channel: Brevitas gives its
            # BatchNorm a denormal gamma) is its bias alone: integers 0
            folded = (s_w * np.abs(a)).astype(np.float32)
            dead = folded < np.finfo(np.float32).tiny
            new_scale = np.where(dead, s_w, folded).astype(np.float32)
            sign = np.where(dead, 0, np.where(a < 0, -1, 1))
            weights[layer.input[1]] = [q * sign.reshape(shape), new_scale, out_axis, quant]
            new_bias = self.const((a * (bias - mean) + beta).astype(np.float32),
                                  f"{layer.name}_bias_folded")
            inputs = [layer.input[0], layer.input[1], new_bias]
            del layer.input[:]
            layer.input.extend(inputs)
            renamed[layer.output[0]] = bn.output[0]
            layer.output[0] = bn.output[0]
            dropped.add(id(bn))
            self.rlog.note(f"BatchNormalization '{bn.name}' folded into the weight scales and "
                           f"bias of {layer.op_type} '{layer.name}', whose integer weights "
                           f"stay the model's")
        return [n for n in nodes if id(n) not in dropped]

    def threshold_layers(self, nodes: "list[onnx.NodeProto]", weights: dict) -> None:
        """A bipolar activation (``BipolarQuant``, or a 1-bit signed ``Quant``: qonnx gives
        ``+s`` where ``x >= 0``, else ``-s``) of a ``Conv``/``Gemm`` with quantized weights
        ``q`` (scale ``s_w``), float bias ``b`` and an input quantized with scale ``s_in``:
        ``x >= 0`` exactly where ``acc >= t = ceil(-b / (s_in * s_w))`` per channel. The layer
        becomes ``v = 2 * acc + 1 - 2t`` (weights ``2q``, int32 bias ``1 - 2t``; odd, so never
        0, of the sign of ``x`` or ``x + 0``) with weight scale ``s / s_in`` so that the
        requantization multiplier is 1: clamped to ``[-1, 1]`` it is ``sign(x)``, ``±1``
        with scale ``s``. The layer's float output is then ``v * s``, not the model's: only
        its sign is read."""
        readers: "dict[str, int]" = {}
        for node in nodes:
            for value in node.input:
                readers[value] = readers.get(value, 0) + 1
        producer = {out: n for n in nodes for out in n.output}
        for node in nodes:
            if node.domain not in QONNX_DOMAINS or node.input[0] in self.consts or \
                    node.output[0] in weights:
                continue
            if node.op_type in ("Quant", "IntQuant"):
                p = self.params(node)
                if not (p["bits"] == 1 and p["signed"]) or p["scale"].size != 1 or \
                        np.any(p["zeropt"] != 0):
                    continue
                scale = p["scale"]
            elif node.op_type == "BipolarQuant":
                scale = self.constant_input(node, 1, "scale").astype(np.float32)
                if scale.size != 1:
                    continue
            else:
                continue
            layer = producer.get(node.input[0])
            if layer is None or not is_default_domain(layer.domain) or \
                    layer.op_type not in ("Conv", "Gemm") or len(layer.input) < 2 or \
                    layer.input[1] not in weights or readers.get(node.input[0]) != 1:
                continue
            attrs = attrs_of(layer)
            if layer.op_type == "Gemm" and (attrs.get("transA", 0) or attrs.get("alpha", 1.0)
                                            != 1.0 or attrs.get("beta", 1.0) != 1.0):
                continue
            source = producer.get(layer.input[0])
            s_in = self.consts.get(source.input[1]) if source is not None and \
                source.domain in QONNX_DOMAINS and source.op_type in (
                    "Quant", "IntQuant", "BipolarQuant") else None
            if s_in is None or s_in.size != 1:
                continue
            q, s_w, axis, quant = weights[layer.input[1]]
            out_axis = 0 if layer.op_type == "Conv" or attrs.get("transB", 0) else 1
            if axis not in (None, out_axis) or np.abs(q).max(initial=0) > 63:
                continue
            channels = q.shape[out_axis]
            bias = layer.input[2] if len(layer.input) > 2 else ""
            if bias in weights:
                b_q, b_scale, b_axis, _ = weights[bias]
                b = b_q.astype(np.float64) * b_scale.astype(np.float64).reshape(-1)
            elif bias in self.consts:
                b = self.consts[bias].astype(np.float64).reshape(-1)
            elif not bias:
                b = np.zeros(channels)
            else:
                continue
            unit = float(s_in.reshape(-1)[0]) * np.broadcast_to(
                s_w.astype(np.float64).reshape(-1), (channels,))
            t = np.ceil(-np.broadcast_to(b, (channels,)) / unit)
            new_scale = np.float32(float(scale.reshape(-1)[0]) / float(s_in.reshape(-1)[0]))
            weights[layer.input[1]] = [2 * q, np.asarray(new_scale), None, quant]
            name = self.fresh(f"{layer.name}_threshold")
            self.prefix.append(self.dequantize_named(
                (1 - 2 * t).astype(np.int32), np.float32(s_in.reshape(-1)[0]) * new_scale, name))
            inputs = [layer.input[0], layer.input[1], name]
            del layer.input[:]
            layer.input.extend(inputs)
            self.bipolar.add(node.output[0])
            self.rlog.note(f"The bipolar activation {label(node)} is the sign of "
                           f"{layer.op_type} '{layer.name}': its weights doubled and an odd "
                           f"integer threshold as bias, requantized by exactly 1 to [-1, 1]")

    def widen(self, nodes: "list[onnx.NodeProto]", weights: dict) -> None:
        """Give the low-bit weights of a layer with a float bias the int8 lanes' headroom:
        ``q * 2^k`` with scale ``s / 2^k`` (the same real weights, bit for bit), so that the
        accumulator's grid, to which the float bias is rounded, is ``2^k`` times finer."""
        for node in nodes:
            if not is_default_domain(node.domain) or node.op_type not in ("Conv", "Gemm") or \
                    len(node.input) < 3 or node.input[1] not in weights or \
                    node.input[2] not in self.consts or node.input[2] in weights:
                continue
            q, scale, axis, quant = weights[node.input[1]]
            largest = int(np.abs(q).max(initial=0))
            if not 0 < largest <= 63:
                continue
            factor = 2 ** int(np.floor(np.log2(127 / largest)))
            widened = (scale / np.float32(factor)).astype(np.float32)
            if np.any(widened < np.finfo(np.float32).tiny):
                continue
            weights[node.input[1]] = [q * factor, widened, axis, quant]
            self.rlog.note(f"The weights of {node.op_type} '{node.name}' ({largest} at most) "
                           f"are held as int8 multiples of {factor} (scale / {factor}): its float "
                           f"bias rounds to a {factor} times finer accumulator grid")

    def drop_relus(self, nodes: "list[onnx.NodeProto]", weights: dict
                   ) -> "list[onnx.NodeProto]":
        """Remove a ``Relu`` read only by an activation quantizer whose range starts at its
        zero point (real 0): the quantizer's clamp is the ReLU, exactly. Then a ReLU on a
        graph input (Brevitas' ``QuantReLU`` input quantizer) is the input's quantization."""
        readers: "dict[str, int]" = {}
        for node in nodes:
            for value in node.input:
                readers[value] = readers.get(value, 0) + 1
        producer = {n.output[0]: n for n in nodes if n.output}
        outputs = {v.name for v in self.graph.output}
        dropped = set()
        for node in nodes:
            if node.domain not in QONNX_DOMAINS or node.op_type not in ("Quant", "IntQuant") \
                    or node.output[0] in weights:
                continue
            relu = producer.get(node.input[0])
            if relu is None or relu.op_type != "Relu" or not is_default_domain(relu.domain) \
                    or readers.get(node.input[0]) != 1 or node.input[0] in outputs:
                continue
            p = self.params(node)
            if p["zeropt"].size != 1 or (p["bits"] == 1 and p["signed"]):
                continue
            if bounds(p["signed"], p["narrow"], p["bits"])[0] == int(p["zeropt"].reshape(-1)[0]):
                node.input[0] = relu.input[0]
                dropped.add(id(relu))
        return [n for n in nodes if id(n) not in dropped]

def cancel_transposes(nodes: "list[onnx.NodeProto]", outputs: "set[str]"
                       ) -> "list[onnx.NodeProto]":
    """Drop the NHWC -> NCHW Transpose pairs between consecutive channels-last operators (the
    middle tensor read by nothing else), so that a BatchNormalization stays next to its
    layer."""
    readers: "dict[str, list]" = {}
    for node in nodes:
        for value in node.input:
            readers.setdefault(value, []).append(node)
    producer = {out: n for n in nodes for out in n.output}
    alias, dropped = {}, set()
    for second in nodes:
        first = producer.get(second.input[0]) if second.op_type == "Transpose" and \
            second.input else None
        if first is None or first.op_type != "Transpose" or id(first) in dropped or \
                len(readers.get(first.output[0], [])) != 1 or second.output[0] in outputs or \
                first.output[0] in outputs:
            continue
        perm1, perm2 = attrs_of(first).get("perm"), attrs_of(second).get("perm")
        if perm1 is None or perm2 is None or [perm1[i] for i in perm2] != list(
                range(len(perm1))):
            continue
        alias[second.output[0]] = alias.get(first.input[0], first.input[0])
        dropped.update((id(first), id(second)))
    kept = [n for n in nodes if id(n) not in dropped]
    for node in kept:
        for index, value in enumerate(node.input):
            if value in alias:
                node.input[index] = alias[value]
    return kept
