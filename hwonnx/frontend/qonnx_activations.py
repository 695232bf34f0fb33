"""The QONNX import's rewrites of run-time tensors' quantizers (a mixin of
:class:`hwonnx.frontend.qonnx._QonnxRewriter`, whose ``params``, ``const``, ``fresh``,
``describe`` and tables it uses): a graph input annotated as a small integer type, an
activation quantizer as QuantizeLinear -> Clip -> DequantizeLinear, a bipolar quantizer as
the host's sign, and ``Trunc`` as a depthwise sum requantized by ``2^-k``
(:mod:`hwonnx.frontend.qonnx` describes the whole import)."""

import re

import numpy as np
import onnx
from onnx import helper

from ..errors import ModelError
from .common import is_default_domain
from .qonnx_layers import QONNX_DOMAINS, RANGES_OF, attrs_of, bounds, label

__all__ = ["QonnxActivationRewrites"]


class QonnxActivationRewrites:
    """The rewrites of quantizers of run-time tensors (inputs, activations, ``Trunc``)."""

    def typed_inputs(self, nodes: "list[onnx.NodeProto]") -> "list[onnx.NodeProto]":
        """A graph input that qonnx's tensor annotation declares an integer type of at most 8
        bits (``finn_datatype`` ``UINT8``, ``INT4``, ``BIPOLAR``, ...), and that no quantizer
        reads, is quantized with scale 1 (QDQ nodes in front of its readers, which read the
        dequantized copy): exact for the values the type allows, and no calibration data
        needed."""
        kinds = {a.tensor_name: p.value for a in self.graph.quantization_annotation
                 for p in a.quant_parameter_tensor_names if p.key == "finn_datatype"}
        inputs = [v.name for v in self.graph.input if v.name not in self.consts]
        added: "list[onnx.NodeProto]" = []
        for x in inputs:
            kind = kinds.get(x, "")
            match = re.fullmatch(r"(U?)INT(\d+)", kind)
            if kind in ("BIPOLAR", "BINARY"):
                lo, hi = (-1, 1) if kind == "BIPOLAR" else (0, 1)
            elif match and 1 <= int(match.group(2)) <= 8:
                lo, hi = bounds(not match.group(1), False, int(match.group(2)))
            else:
                continue
            readers = [n for n in nodes if x in n.input]
            if not readers or any(n.domain in QONNX_DOMAINS for n in readers):
                continue
            dtype = np.int8 if hi <= 127 else np.uint8
            typed = self.fresh(f"{x}_{kind.lower()}")
            s = self.const(np.array(1.0, np.float32), f"{x}_scale")
            z = self.const(np.array(0, dtype), f"{x}_zero_point")
            q = self.fresh(f"{x}_quantized")
            added.append(helper.make_node("QuantizeLinear", [x, s, z], [q],
                                          name=self.fresh(f"{x}_quantize")))
            # (no Clip: the annotation promises the values, it does not clamp them)
            added.append(helper.make_node("DequantizeLinear", [q, s, z], [typed],
                                          name=self.fresh(f"{x}_dequantize")))
            for node in readers:
                for index, value in enumerate(node.input):
                    if value == x:
                        node.input[index] = typed
            self.rlog.note(f"Input '{x}' holds {kind} values (qonnx's tensor annotation): "
                           f"quantized with scale 1, exactly for values in [{lo}, {hi}]")
        return added

    def activation(self, node: onnx.NodeProto) -> "list[onnx.NodeProto]":
        """An activation quantizer as QuantizeLinear -> Clip -> DequantizeLinear (of a copy
        of its input requantized on the array when another quantizer writes that input:
        :meth:`requantize_input`)."""
        copy = self.requantize_input(node) if node.op_type != "BipolarQuant" else []
        return copy + self.quantize_activation(node)

    def quantize_activation(self, node: onnx.NodeProto) -> "list[onnx.NodeProto]":
        x, y = node.input[0], node.output[0]
        if node.output[0] in self.bipolar:
            return self.sign_nodes(node, self.constant_input(node, 1, "scale")
                                   .astype(np.float32))
        if node.op_type == "BipolarQuant":
            return self.sign_input(node)
        p = self.params(node)
        bits, signed, narrow = p["bits"], p["signed"], p["narrow"]
        if p["scale"].size != 1 or p["zeropt"].size != 1:
            raise ModelError(f"{label(node)} quantizes the run-time tensor '{x}' per channel; "
                             f"hwonnx quantizes activations per tensor")
        if bits == 1 and signed:
            if np.any(p["zeropt"] != 0):
                raise ModelError(f"{label(node)} is a 1-bit signed (bipolar) quantizer of the "
                                 f"run-time tensor '{x}' with zero point "
                                 f"{p['zeropt'].reshape(-1)[0]:g}; hwonnx maps bipolar "
                                 f"quantizers of zero point 0")
            return self.sign_input(node, "x/scale")    # (no rounding: a sign)
        if p["rounding"] not in ("ROUND", "HALF_EVEN"):
            raise ModelError(f"{label(node)} rounds the run-time tensor '{x}' with "
                             f"rounding_mode {p['rounding']}; hwonnx requantizes activations "
                             f"with ROUND (half to even)")
        lo, hi = bounds(signed, narrow, bits)
        zeropt = int(p["zeropt"].reshape(-1)[0])
        dtype = np.int8 if lo >= -128 and hi <= 127 else np.uint8
        full = RANGES_OF[np.dtype(dtype)]
        if not (full[0] <= lo and hi <= full[1] and full[0] <= zeropt <= full[1]):
            raise ModelError(f"{label(node)} quantizes the run-time tensor '{x}' to {bits} "
                             f"{'signed' if signed else 'unsigned'} bits with zero point "
                             f"{zeropt}; hwonnx's activations are 2 to 8 bits whose range and "
                             f"zero point fit int8 or uint8")
        self.describe(node, bits, signed, narrow, p["scale"], p["rounding"])
        s = self.const(p["scale"].reshape(()), f"{y}_scale")
        z = self.const(np.array(zeropt, dtype), f"{y}_zero_point")
        q, c = self.fresh(f"{y}_quantized"), self.fresh(f"{y}_clipped")
        nodes = [helper.make_node("QuantizeLinear", [x, s, z], [q], name=node.name)]
        if (lo, hi) != full:            # qonnx clamps x / s + zeropt, the stored integer
            nodes.append(helper.make_node(
                "Clip", [q, self.const(np.array(lo, dtype), f"{y}_min"),
                         self.const(np.array(hi, dtype), f"{y}_max")],
                [c], name=self.fresh(f"{node.name}_clip")))
        else:
            c = q
        nodes.append(helper.make_node("DequantizeLinear", [c, s, z], [y],
                                      name=self.fresh(f"{node.name}_dequantize")))
        return nodes

    def sign_input(self, node: onnx.NodeProto, mode: str = "x") -> "list[onnx.NodeProto]":
        """A ``BipolarQuant`` (``+s`` where ``x >= 0``, else ``-s``; ``mode="x"``) or a 1-bit
        signed ``Quant`` of zero point 0 (where ``x / s >= 0`` in float32; ``mode="x/scale"``)
        of a tensor that no layer writes as its sign (:meth:`threshold_layers`): the host's
        quantization of an input, which computes the sign itself
        (:func:`hwonnx.golden.quantize`, ``sign=mode``);
        QuantizeLinear -> Clip to ``[-1, 1]`` -> DequantizeLinear with scale ``s`` in the
        float graph. Refused later (:func:`hwonnx.quant.ranges.apply_ranges`) if an
        accelerator layer writes the tensor."""
        x = node.input[0]
        scale = self.constant_input(node, 1, "scale").astype(np.float32)
        self.check_scale(node, scale, "scale")
        source = self.producers.get(x)
        if source is not None and source.domain in QONNX_DOMAINS:
            raise ModelError(f"{label(node)} quantizes '{x}', which {label(source)} already "
                             f"quantizes, to ±1; hwonnx maps a bipolar tensor as an input the "
                             f"host quantizes or as the sign of a Conv or Gemm with quantized "
                             f"weights")
        if scale.size != 1:
            raise ModelError(f"{label(node)} quantizes the run-time tensor '{x}' per channel; "
                             f"hwonnx quantizes activations per tensor")
        if x in self.signs and self.signs[x][1] != node.name:
            raise ModelError(f"{label(node)} quantizes '{x}' to ±1 as "
                             f"'{self.signs[x][1]}' does; hwonnx quantizes an input once")
        self.signs[x] = (mode, node.name)
        return self.sign_nodes(node, scale)

    def sign_nodes(self, node: onnx.NodeProto, scale: np.ndarray) -> "list[onnx.NodeProto]":
        """``node``'s output as the QDQ nodes of a quantization to ±1 (int8 -1 .. 1, zero
        point 0) with ``scale``."""
        x, y = node.input[0], node.output[0]
        self.describe(node, 1, True, False, scale, "sign")
        s = self.const(scale.reshape(()), f"{y}_scale")
        z = self.const(np.array(0, np.int8), f"{y}_zero_point")
        q, c = self.fresh(f"{y}_quantized"), self.fresh(f"{y}_clipped")
        return [helper.make_node("QuantizeLinear", [x, s, z], [q], name=node.name),
                helper.make_node("Clip", [q, self.const(np.array(-1, np.int8), f"{y}_min"),
                                          self.const(np.array(1, np.int8), f"{y}_max")],
                                 [c], name=self.fresh(f"{node.name}_clip")),
                helper.make_node("DequantizeLinear", [c, s, z], [y],
                                 name=self.fresh(f"{node.name}_dequantize"))]

    def trunc(self, node: onnx.NodeProto) -> "list[onnx.NodeProto]":
        """``Trunc`` (5 inputs: qonnx's ``trunc_v1``; 6: ``trunc_v2``) of a tensor on the grid
        of its ``scale`` (zero point 0): ``R(n / 2^k)`` of its integers ``n``, ``R`` the
        rounding mode, then (v2) clamped to the output bits. It becomes a depthwise
        convolution with weights 1 (a 1x1 copy, or the window of an ``AveragePool`` whose
        ``Mul`` by the window size turns it back into the sum, as Brevitas' ``TruncAvgPool2d``
        exports it) requantized by exactly ``2^-k``: ROUND/HALF_EVEN by the rounding unit (half
        to even), FLOOR and CEIL by half up with the bias ``-2^(k-1)`` or ``2^(k-1) - 1``."""
        attrs = attrs_of(node)
        v2 = len(node.input) >= 6
        version = self.opsets.get(node.domain, 1)
        if v2 != (version >= 2):
            raise ModelError(f"{label(node)} has {len(node.input)} inputs but the model imports "
                             f"{node.domain} version {version}, for which qonnx's executor runs "
                             f"the {'6' if version >= 2 else '5'}-input Trunc")
        if "rounding_mode" not in attrs:
            raise ModelError(f"{label(node)} has no attribute 'rounding_mode'; qonnx's "
                             f"reference executor requires it: set it explicitly")
        rounding = attrs["rounding_mode"]
        rounding = (rounding.decode() if isinstance(rounding, bytes) else rounding).upper()
        if rounding not in ("ROUND", "HALF_EVEN", "FLOOR", "CEIL"):
            raise ModelError(f"{label(node)} has rounding_mode '{rounding}'; hwonnx maps Trunc "
                             f"with ROUND, HALF_EVEN, FLOOR or CEIL")
        scale = self.constant_input(node, 1, "scale").astype(np.float32)
        zeropt = self.constant_input(node, 2, "zero point")
        in_bits = self.bit_width(node, 3, "input bit width")
        if scale.size != 1 or np.any(zeropt != 0):
            raise ModelError(f"{label(node)} has a per-channel scale or a zero point other "
                             f"than 0; hwonnx maps Trunc of a per-tensor grid with zero point 0")
        self.check_scale(node, scale, "scale")
        if v2:
            out_scale = self.constant_input(node, 4, "output scale").astype(np.float32)
            out_bits = self.bit_width(node, 5, "output bit width")
            self.check_scale(node, out_scale, "output scale")
            # both positive and finite: so is their ratio (float64 of float32 values)
            ratio = float(out_scale.reshape(-1)[0]) / float(scale.reshape(-1)[0]) \
                if out_scale.size == 1 else None
            k = int(np.round(np.log2(ratio))) if ratio is not None else -1
            if ratio is None or ratio != 2.0 ** k or k < 0:
                raise ModelError(f"{label(node)} has output scale {out_scale.reshape(-1)[:2]} "
                                 f"and scale {scale.reshape(-1)[0]}; hwonnx maps Trunc whose "
                                 f"output scale is the scale times a power of two (at least 1)")
            signed, narrow = bool(attrs.get("signed", 1)), bool(attrs.get("narrow", 0))
            lo, hi = bounds(signed, narrow, out_bits)
            w_scale, s_out = np.float32(1.0), out_scale.reshape(())
        else:
            out_bits = self.bit_width(node, 4, "output bit width")
            k = in_bits - out_bits
            lo, hi = (-128, 127)
            w_scale, s_out = np.float32(2.0 ** -k), scale.reshape(())
        if k < 0 or k > 24:
            raise ModelError(f"{label(node)} shifts by {k} bits; hwonnx maps 0 to 24")
        if lo < -128 or hi > 127:
            raise ModelError(f"{label(node)} truncates to {out_bits} bits; hwonnx's activations "
                             f"are at most 8 (signed) or 7 (unsigned) bits here")
        x, window = node.input[0], None
        mul = self.producers.get(x)
        pool = self.producers.get(mul.input[0]) if mul is not None and mul.op_type == "Mul" \
            and is_default_domain(mul.domain) else None
        if pool is not None and pool.op_type == "AveragePool" and is_default_domain(pool.domain):
            p_attrs = attrs_of(pool)
            kernel = list(p_attrs.get("kernel_shape", []))
            factor = self.consts.get(mul.input[1])
            if len(kernel) == 2 and factor is not None and factor.size == 1 and \
                    float(factor.reshape(-1)[0]) == kernel[0] * kernel[1] and \
                    not any(p_attrs.get("pads", [])) and \
                    p_attrs.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET") and \
                    not p_attrs.get("ceil_mode", 0) and self.readers.get(x) == 1 and \
                    self.readers.get(mul.output[0]) == 1 and \
                    self.readers.get(pool.output[0]) == 1:
                window = (kernel, list(p_attrs.get("strides", [1, 1])))
                x = pool.input[0]
                self.removed.update((id(pool), id(mul)))
        source = self.producers.get(x)
        if source is None or source.domain not in QONNX_DOMAINS or \
                source.op_type not in ("Quant", "IntQuant") or \
                source.input[1] not in self.consts or \
                self.consts[source.input[1]].size != 1 or \
                np.float32(self.consts[source.input[1]].reshape(-1)[0]) != scale.reshape(-1)[0] \
                or np.any(self.consts.get(source.input[2], 1) != 0):
            raise ModelError(f"{label(node)} truncates '{x}', which no activation quantizer of "
                             f"scale {scale.reshape(-1)[0]} and zero point 0 writes; hwonnx maps "
                             f"Trunc of a quantized tensor (directly, or through an AveragePool "
                             f"and a Mul by its window size)")
        channels = self.channels_of(x, node)
        kernel, strides = window or ([1, 1], [1, 1])
        y = node.output[0]
        conv_out = self.fresh(f"{y}_sum")
        weight = self.fresh(f"{y}_weight")
        nodes = [self.dequantize_named(np.ones((channels, 1, *kernel), np.int8),
                                       np.float32(w_scale), weight)]
        bias_int = {"FLOOR": -(2 ** (k - 1)) if k else 0,
                    "CEIL": 2 ** (k - 1) - 1 if k else 0}.get(rounding, 0)
        bias = self.fresh(f"{y}_bias")
        acc_scale = np.float32(scale.reshape(-1)[0] * w_scale)
        nodes.append(self.dequantize_named(np.full(channels, bias_int, np.int32), acc_scale,
                                           bias))
        nodes.append(helper.make_node("Conv", [x, weight, bias], [conv_out], name=node.name,
                                      group=channels, kernel_shape=kernel, strides=strides))
        self.quantizers.append({"node": node.name, "op": "Trunc", "layer": node.name,
                                "role": "output", "bits": out_bits, "signed": lo < 0,
                                "narrow": False, "scale": "power-of-two shift", "rounding":
                                rounding})
        s = self.const(np.asarray(s_out, np.float32), f"{y}_scale")
        z = self.const(np.array(0, np.int8), f"{y}_zero_point")
        q, c = self.fresh(f"{y}_quantized"), self.fresh(f"{y}_clipped")
        nodes.append(helper.make_node("QuantizeLinear", [conv_out, s, z], [q],
                                      name=self.fresh(f"{node.name}_quantize")))
        if (lo, hi) != (-128, 127):
            nodes.append(helper.make_node(
                "Clip", [q, self.const(np.array(lo, np.int8), f"{y}_min"),
                         self.const(np.array(hi, np.int8), f"{y}_max")], [c],
                name=self.fresh(f"{node.name}_clip")))
        else:
            c = q
        nodes.append(helper.make_node("DequantizeLinear", [c, s, z], [y],
                                      name=self.fresh(f"{node.name}_dequantize")))
        if rounding in ("FLOOR", "CEIL"):         # the bias does it, with half-up rounding
            self.half_up.update((conv_out, q, c, y))
        return nodes
