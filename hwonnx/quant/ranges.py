"""Clamp ranges a pre-quantized model gives its tensors (QCDQ's ``Clip``, QONNX's ``Quant``
to fewer than 8 bits or a narrow range): the requantization of the node writing such a tensor
saturates to the range instead of int8's."""

from dataclasses import replace

import numpy as np

from ..errors import QuantizationError
from ..ir.graph import Node

__all__ = ["apply_ranges"]


def apply_ranges(nodes: "list[Node]", ranges: "dict[str, tuple[int, int]]",
                 qname: "dict[str, str]", half_up=frozenset()) -> "list[Node]":
    """Return ``nodes`` (integer graph nodes) with ``lo``/``hi`` narrowed to the recorded
    range of the float value each writes (``qname``: float value -> int8 value), and a
    lookup table's entries clamped to it; a node writing a value of ``half_up`` loses its
    ``rounding`` (a QONNX ``Trunc`` whose bias turns half up into a floor or ceiling)."""
    if not ranges and not half_up:
        return nodes
    wanted = {qname[v]: r for v, r in ranges.items() if v in qname}
    plain = {qname[v] for v in half_up if v in qname}
    result = []
    for node in nodes:
        rng = wanted.get(node.outputs[0]) if node.outputs else None
        if node.outputs and node.outputs[0] in plain:
            node = replace(node, attrs={k: v for k, v in node.attrs.items() if k != "rounding"})
        if rng is None:
            result.append(node)
            continue
        attrs = dict(node.attrs)
        if attrs.get("table") is not None:       # the range is the table's output's
            attrs["table"] = tuple(int(v) for v in np.clip(attrs["table"], *rng))
        elif "lo" in attrs:
            lo, hi = max(int(attrs["lo"]), rng[0]), min(int(attrs["hi"]), rng[1])
            attrs["lo"], attrs["hi"] = (lo, hi) if lo <= hi else (rng[0], rng[0])
        elif node.op == "Quantize":
            raise QuantizationError(f"Input '{node.inputs[0]}' is quantized to [{rng[0]}, "
                                    f"{rng[1]}] of int8 (fewer bits or a narrow range), but the "
                                    f"host quantizes inputs to all of int8; quantize the input "
                                    f"to 8 bits")
        elif node.op not in ("Flatten", "Reshape"):    # a layout op keeps its input's values
            raise QuantizationError(f"Node '{node.name}' ({node.op}) writes a tensor quantized "
                                    f"to the range [{rng[0]}, {rng[1]}] of int8, but it has no "
                                    f"clamp to narrow")
        result.append(replace(node, attrs=attrs))
    return result
