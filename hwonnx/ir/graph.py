"""hwonnx's own graph IR. ONNX protobufs never leave ``hwonnx.frontend``; past it, a model is a
:class:`Graph` of :class:`Node` objects in topological order.

Two op vocabularies share this structure (documented in ``docs/ir.md``; every op is declared
in the operator registry, :mod:`hwonnx.ir.ops`):

* the **float graph** made by the frontend: ``Conv``, ``Dense``, ``ConvTranspose``, ``Add``,
  ``Eltwise``, ``AvgPool``, ``MaxPool``, ``Concat``, ``Slice``, ``Permute``,
  ``ChannelPermute``, ``Relu``, ``BatchNorm``, ``Flatten``, ``Reshape``, ``Identity``,
  ``Softmax`` and the table activations (``LeakyRelu``, ``Sigmoid``, ...);
* the **integer graph** made by the quantizer: ``Quantize``, the ``Q...`` layers of those,
  ``Flatten``, ``Reshape``, ``Dequantize`` and host ``Softmax``; every one of them is defined
  bit for bit by a function of :mod:`hwonnx.golden`.

Both may hold float32 host steps before the accelerator's input and after its output (``Sub``,
``Div``, ``Transpose``, ``ArgMax``, ``TopK``, ...: :mod:`hwonnx.golden.host`).
"""

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from ..errors import HwonnxError

__all__ = ["TensorType", "Node", "Graph", "IRVerificationError"]


class IRVerificationError(HwonnxError):
    """A pass produced an ill-formed graph; names the node."""


@dataclass(frozen=True)
class TensorType:
    """Element type (a NumPy dtype name such as ``"float32"`` or ``"int8"``) and static shape."""
    dtype: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True)
class Node:
    """One operation. ``attrs`` is read-only."""
    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        if not isinstance(self.attrs, MappingProxyType):
            object.__setattr__(self, "attrs", MappingProxyType(dict(self.attrs)))

    def with_attrs(self, **changes) -> "Node":
        return replace(self, attrs={**self.attrs, **changes})


@dataclass(frozen=True)
class Graph:
    """An immutable dataflow graph; passes return a new ``Graph``.

    ``types`` gives the type of every value (inputs, constants and node outputs);
    ``constants`` maps constant value names to NumPy arrays; ``meta`` carries model metadata
    (producer, versions, notes) into the build report.
    """
    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    types: Mapping[str, TensorType] = field(hash=False, compare=False)
    constants: Mapping[str, np.ndarray] = field(default_factory=dict, hash=False,
                                                compare=False)
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        for name in ("types", "constants", "meta"):
            value = getattr(self, name)
            if not isinstance(value, MappingProxyType):
                object.__setattr__(self, name, MappingProxyType(dict(value)))

    def producer(self, value: str) -> "Node | None":
        for node in self.nodes:
            if value in node.outputs:
                return node
        return None

    def consumers(self, value: str) -> "list[Node]":
        return [node for node in self.nodes if value in node.inputs]

    def verify(self) -> None:
        """Check SSA, definition before use and that every value has a type."""
        defined = set(self.inputs) | set(self.constants)
        for value in defined:
            if value not in self.types:
                raise IRVerificationError(f"Value '{value}' has no type")
        for node in self.nodes:
            for value in node.inputs:
                if value and value not in defined:
                    raise IRVerificationError(
                        f"Node '{node.name}' ({node.op}) reads '{value}' before it is defined")
            for value in node.outputs:
                if value in defined:
                    raise IRVerificationError(
                        f"Node '{node.name}' ({node.op}) redefines '{value}'")
                if value not in self.types:
                    raise IRVerificationError(
                        f"Node '{node.name}' ({node.op}) writes '{value}', which has no type")
                defined.add(value)
        for value in self.outputs:
            if value not in defined:
                raise IRVerificationError(f"Graph output '{value}' is never produced")

    def __repr__(self) -> str:
        lines = [f"graph({', '.join(self.inputs)}) -> ({', '.join(self.outputs)})"]
        for node in self.nodes:
            attrs = ", ".join(f"{k}={v!r}" for k, v in node.attrs.items())
            lines.append(f"  {', '.join(node.outputs)} = {node.op}({', '.join(node.inputs)})"
                         f"{' {' + attrs + '}' if attrs else ''}  # {node.name}")
        return "\n".join(lines)
