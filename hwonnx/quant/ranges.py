"""Clamp ranges a pre-quantized model gives its tensors (QCDQ's ``Clip``, QONNX's ``Quant``
to fewer than 8 bits or a narrow range): the requantization of the node writing such a tensor
saturates to the range instead of int8's, and the host's ``Quantize`` of an input to it."""

from dataclasses import replace

import numpy as np

from ..errors import QuantizationError
from ..ir.graph import Node

__all__ = ["apply_ranges"]


def apply_ranges(nodes: "list[Node]", ranges: "dict[str, tuple[int, int]]",
                 qname: "dict[str, str]", half_up=frozenset(),
                 signs: "dict[str, tuple[str, str]] | None" = None) -> "list[Node]":
    """Return ``nodes`` (integer graph nodes) with ``lo``/``hi`` narrowed to the recorded
    range of the float value each writes (``qname``: float value -> int8 value; a host
    ``Quantize`` gets ``lo``/``hi`` attributes), and a lookup table's entries clamped to it;
    a node writing a value of ``half_up`` loses its ``rounding`` (a QONNX ``Trunc`` whose bias
    turns half up into a floor or ceiling). ``signs`` maps a value quantized to ``±1`` by its
    sign (QONNX ``BipolarQuant``) to ``(mode, quantizer node)``: the host's ``Quantize`` of it
    gets ``sign=mode`` (:func:`hwonnx.golden.quantize`); an accelerator node cannot write it.

    Raises
    ------
    QuantizationError
        A node with no clamp writes a value of narrowed range, or an accelerator node writes
        a value of ``signs``.
    """
    signs = signs or {}
    if not ranges and not half_up and not signs:
        return nodes
    wanted = {qname[v]: r for v, r in ranges.items() if v in qname}
    plain = {qname[v] for v in half_up if v in qname}
    bipolar = {qname[v]: (v, *m) for v, m in signs.items() if v in qname}
    result = []
    for node in nodes:
        rng = wanted.get(node.outputs[0]) if node.outputs else None
        if node.outputs and node.outputs[0] in plain:
            node = replace(node, attrs={k: v for k, v in node.attrs.items() if k != "rounding"})
        if node.outputs and node.outputs[0] in bipolar:
            value, mode, quantizer = bipolar[node.outputs[0]]
            if node.op != "Quantize":
                raise QuantizationError(f"Node '{quantizer}' quantizes '{value}' to ±1 by its "
                                        f"sign, but '{value}' is computed by '{node.name}' "
                                        f"({node.op}) on the accelerator; hwonnx maps a "
                                        f"bipolar tensor as an input the host quantizes or as "
                                        f"the sign of a Conv or Gemm with quantized weights")
            node = node.with_attrs(sign=mode)
        if rng is None:
            result.append(node)
            continue
        attrs = dict(node.attrs)
        if attrs.get("table") is not None:       # the range is the table's output's
            attrs["table"] = tuple(int(v) for v in np.clip(attrs["table"], *rng))
        elif "lo" in attrs or node.op == "Quantize":
            lo, hi = max(int(attrs.get("lo", -128)), rng[0]), min(int(attrs.get("hi", 127)),
                                                                  rng[1])
            attrs["lo"], attrs["hi"] = (lo, hi) if lo <= hi else (rng[0], rng[0])
        elif node.op not in ("Flatten", "Reshape"):    # a layout op keeps its input's values
            raise QuantizationError(f"Node '{node.name}' ({node.op}) writes a tensor quantized "
                                    f"to the range [{rng[0]}, {rng[1]}] of int8, but it has no "
                                    f"clamp to narrow")
        result.append(replace(node, attrs=attrs))
    return result
