"""The converter's state and the helpers every converter module shares (:mod:`.convert`,
:mod:`.slicing`, :mod:`.upsample`, :mod:`.eltwise`, :mod:`.host`): the ``GraphBuilder`` that
registers values and constants of the float graph, attribute reading, window checks, and the
refusal of a form of a supported operator."""

import math

import numpy as np
import onnx

from ..errors import ModelError, ResourceError, UnsupportedOperatorError
from ..golden.im2col import conv_output_size
from ..ir.evaluate import MAX_VALUE_ELEMENTS
from ..ir.graph import TensorType
from .common import FLOAT_TYPES, MAX_RANK, count_text, domain_opset, elem_type_name

__all__ = ["GraphBuilder", "NO_ACTIVATION", "node_attrs", "explicit_pads", "check_windows",
           "check_per_channel", "check_unused", "input_4d", "unsupported"]


class GraphBuilder:
    """Collects the IR constants and types while the nodes are converted."""

    def __init__(self, model: onnx.ModelProto, nodes, constants: dict, types: dict):
        self.opset = domain_opset(model, "")
        self.onnx_constants = constants
        self.onnx_types = types
        self.constants: "dict[str, np.ndarray]" = {}
        self.types: "dict[str, TensorType]" = {}
        self.notes: "list[str]" = []
        self.taken = set(types) | set(constants)
        self.used = {v for node in nodes for v in node.input} | \
            {value.name for value in model.graph.output}
        self.producer = {v: node for node in nodes for v in node.output if v}
        self.readers: "dict[str, list[onnx.NodeProto]]" = {}
        for node in nodes:
            for v in node.input:
                if v:
                    self.readers.setdefault(v, []).append(node)
        self.outputs = frozenset(value.name for value in model.graph.output)
        self.converted: "set[str]" = set()

    def _note_dtype(self, dtype: str) -> None:
        if dtype != "float32":
            note = f"Converted {dtype} values to float32"
            if note not in self.notes:
                self.notes.append(note)

    def array(self, node: "onnx.NodeProto | None", name: str) -> np.ndarray:
        """Return the float32 value of the constant ``name`` read by ``node`` (None for a
        graph output)."""
        value = self.onnx_constants[name]
        if value.dtype.kind != "f" and str(value.dtype) != "bfloat16":
            user = f"Node '{node.name}' ({node.op_type})" if node else "The graph output"
            raise ModelError(f"{user} needs a floating-point constant '{name}', not "
                             f"{value.dtype}")
        self._note_dtype(str(value.dtype))
        if name in self.converted:
            return value                      # converted already: one copy per constant
        if value.dtype != np.float32 or not value.flags.writeable:
            with np.errstate(over="ignore", invalid="ignore"):
                value = value.astype(np.float32)
        if not _finite(value):
            user = f"Node '{node.name}' ({node.op_type})" if node else "The graph output"
            raise ModelError(f"{user} reads constant '{name}', which holds non-finite values "
                             f"(NaN or infinity) in float32; hwonnx quantizes only finite "
                             f"values")
        if self.onnx_constants[name].dtype == np.float32:
            self.onnx_constants[name] = value  # a read-only original can be freed
            self.converted.add(name)
        return value

    def constant(self, node: "onnx.NodeProto | None", name: str) -> str:
        """Register the ONNX constant ``name`` as an IR constant and return its name."""
        if name not in self.constants:
            value = self.array(node, name)
            self.constants[name] = value
            self.types[name] = TensorType("float32", tuple(value.shape))
        return name

    def new_constant(self, base: str, value: np.ndarray) -> str:
        """Add a constant made by the converter under a fresh name derived from ``base``."""
        name, index = base, 1
        while name in self.taken:
            name, index = f"{base}_{index}", index + 1
        self.taken.add(name)
        self.constants[name] = np.ascontiguousarray(value, dtype=np.float32)
        self.types[name] = TensorType("float32", tuple(value.shape))
        return name

    def new_value(self, base: str, shape: "tuple[int, ...]") -> str:
        """Add a float run-time value made by the converter (between the nodes it makes for
        one ONNX node) under a fresh name derived from ``base``."""
        name, index = base, 1
        while name in self.taken:
            name, index = f"{base}_{index}", index + 1
        self.taken.add(name)
        self.types[name] = TensorType("float32", tuple(shape))
        return name

    def value(self, name: str) -> str:
        """Register the type of the run-time value ``name`` and return its name."""
        if name not in self.types:
            elem_type, shape = self.onnx_types.get(name, (0, None))
            if elem_type not in FLOAT_TYPES:
                raise ModelError(f"Value '{name}' must be floating point, not "
                                 f"{elem_type_name(elem_type)}")
            if shape is None:
                raise ModelError(f"Shape inference could not give '{name}' a static shape")
            node = self.producer.get(name)
            what = f"Value '{name}'" + (f" (output of {node.op_type} '{node.name}')"
                                        if node is not None else "")
            if any(d <= 0 for d in shape):
                raise ModelError(f"{what} has shape {list(shape)}; every dimension of a value "
                                 f"computed at run time must be positive")
            if len(shape) > MAX_RANK:
                raise ModelError(f"{what} has rank {len(shape)}, more than hwonnx's limit of "
                                 f"{MAX_RANK} axes")
            if math.prod(shape) > MAX_VALUE_ELEMENTS:
                raise ResourceError(f"{what} has shape {list(shape)}, "
                                    f"{count_text(math.prod(shape))} elements, more than "
                                    f"hwonnx's limit of {MAX_VALUE_ELEMENTS} for a value "
                                    f"computed at run time")
            self._note_dtype(FLOAT_TYPES[elem_type])
            self.types[name] = TensorType("float32", shape)
        return name

    def shape(self, name: str) -> "tuple[int, ...]":
        return self.types[self.value(name)].shape


def _finite(value: np.ndarray, block: int = 1 << 20) -> bool:
    """Whether every element of ``value`` is finite (checked a block at a time: a weight may
    take a large part of the memory hwonnx is allowed)."""
    flat = value.reshape(-1)
    return all(np.isfinite(flat[i:i + block]).all() for i in range(0, flat.size, block))


def node_attrs(node: onnx.NodeProto) -> dict:
    """The attributes of ``node`` as Python values (strings decoded); raises
    :class:`ModelError` for a float attribute that is not finite."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    attrs = {k: v.decode(errors="replace") if isinstance(v, bytes) else v
             for k, v in attrs.items()}
    for key, value in attrs.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ModelError(f"{node.op_type} '{node.name}' has attribute {key}={value}; it must "
                             f"be finite")
    return attrs


def explicit_pads(node: onnx.NodeProto, attrs: dict, size: "tuple[int, ...]",
                  kernel: "tuple[int, ...]", strides: "tuple[int, ...]",
                  dilations: "tuple[int, ...]") -> "tuple[int, int, int, int]":
    """Return ``(top, left, bottom, right)`` from ``pads`` or ``auto_pad`` of a Conv or pool."""
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad != "NOTSET" and "pads" in attrs:
        raise ModelError(f"{node.op_type} '{node.name}' has both auto_pad '{auto_pad}' and pads "
                         f"{list(attrs['pads'])}; pads may be given only with auto_pad NOTSET "
                         f"(ONNX: the two attributes cannot be used together)")
    if auto_pad == "NOTSET":
        return tuple(attrs.get("pads", (0, 0, 0, 0)))
    if auto_pad == "VALID":
        return (0, 0, 0, 0)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for n, k, s, d in zip(size, kernel, strides, dilations):
            total = max(0, (math.ceil(n / s) - 1) * s + (k - 1) * d + 1 - n)
            first = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            begin.append(first)
            end.append(total - first)
        return (*begin, *end)
    raise ModelError(f"{node.op_type} '{node.name}' has auto_pad '{auto_pad}'; it must be "
                     f"NOTSET, VALID, SAME_UPPER or SAME_LOWER")


def check_windows(b: GraphBuilder, node: onnx.NodeProto, shape: "tuple[int, ...]",
                  kernel: "tuple[int, ...]", strides: "tuple[int, ...]",
                  pads: "tuple[int, ...]", dilations: "tuple[int, ...]") -> None:
    """Check that the windows of a Conv or pool fit its padded input and give the output
    shape inference found for it."""
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    padded = [n + begin + end for n, begin, end in zip(shape[2:], pads[:2], pads[2:])]
    if any(span > size for span, size in zip(spans, padded)):
        dilated = "" if tuple(dilations) == (1, 1) else \
            f" (kernel {list(kernel)}, dilations {list(dilations)})"
        raise ModelError(f"{node.op_type} '{node.name}' has a {spans[0]}x{spans[1]} "
                         f"{'dilated ' if dilated else ''}kernel{dilated}, larger than its "
                         f"{padded[0]}x{padded[1]} padded input: its output would be empty")
    sizes = [conv_output_size(n, k, s, begin, end, d) for n, k, s, begin, end, d
             in zip(shape[2:], kernel, strides, pads[:2], pads[2:], dilations)]
    inferred = b.onnx_types.get(node.output[0], (0, None))[1]
    if inferred is not None and len(inferred) == 4 and list(inferred[2:]) != sizes:
        raise ModelError(f"{node.op_type} '{node.name}' computes a {sizes[0]}x{sizes[1]} output "
                         f"from its attributes, but shape inference gives '{node.output[0]}' "
                         f"shape {list(inferred)}")


def check_per_channel(b: GraphBuilder, node: onnx.NodeProto, index: int, role: str, count: int,
                      unit: str) -> None:
    """Check that input ``index`` of ``node`` (a constant) holds one value per ``unit``."""
    name = node.input[index]
    shape = list(np.shape(b.onnx_constants[name]))
    if shape != [count]:
        raise ModelError(f"{node.op_type} '{node.name}' has {role} '{name}' of shape {shape}; it "
                         f"must have shape [{count}] (one value per {unit})")


def check_unused(b: GraphBuilder, node: onnx.NodeProto, what: str) -> None:
    """Check that the outputs of ``node`` after its first (``what``: a training output) are
    not read."""
    extra = [value for value in node.output[1:] if value and value in b.used]
    if extra:
        raise ModelError(f"{node.op_type} '{node.name}' output '{extra[0]}' ({what}) must be "
                         f"unused; hwonnx runs inference only")


def input_4d(b: GraphBuilder, node: onnx.NodeProto, what: str
             ) -> "tuple[str, tuple[int, ...]]":
    """The IR value and shape of ``node``'s first input, which must be 4-D (a 2-D ``what``)."""
    x = b.value(node.input[0])
    shape = b.shape(x)
    if len(shape) != 4:
        raise ModelError(f"{node.op_type} '{node.name}' must be a 2-D {what} (4-D input), not "
                         f"{len(shape) - 2}-D")
    return x, shape


#: Attributes of a layer-like node (Conv, Dense, Add, AvgPool) before any fusion.
NO_ACTIVATION = {"relu": False, "act_max": None}


def unsupported(b: GraphBuilder, node: onnx.NodeProto, reason: str) -> UnsupportedOperatorError:
    """Return the error refusing ``node`` (a form of a supported operator hwonnx cannot map)."""
    return UnsupportedOperatorError.with_reasons([(node.name, node.op_type, "", b.opset)],
                                                 [reason])
