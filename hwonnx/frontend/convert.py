"""Conversion of folded ONNX nodes to the float IR vocabulary of :mod:`hwonnx.ir.graph`; one
function per ONNX operator, all registered in ``CONVERTERS``."""

import math
from typing import Callable

import numpy as np
import onnx

from ..errors import HwonnxError, ModelError, ResourceError, UnsupportedOperatorError
from ..golden.im2col import conv_output_size, windows_touch_input
from ..ir.evaluate import MAX_VALUE_ELEMENTS, check_node_work
from ..ir.ops import IR_OPS
from ..ir.tables import TABLE_OPS
from ..ir.graph import Graph, Node, TensorType
from ..passes.rewrite import channel_scale_node, channel_weight
from .common import FLOAT_TYPES, count_text, domain_opset, elem_type_name, summary
from .eltwise import convert_eltwise, eltwise_shapes

__all__ = ["CONVERTERS", "convert_graph"]


class _Builder:
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


def _attrs(node: onnx.NodeProto) -> dict:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    attrs = {k: v.decode(errors="replace") if isinstance(v, bytes) else v
             for k, v in attrs.items()}
    for key, value in attrs.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ModelError(f"{node.op_type} '{node.name}' has attribute {key}={value}; it must "
                             f"be finite")
    return attrs


def _explicit_pads(node: onnx.NodeProto, attrs: dict, size: "tuple[int, ...]",
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


def _check_windows(b: _Builder, node: onnx.NodeProto, shape: "tuple[int, ...]",
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


def _check_per_channel(b: _Builder, node: onnx.NodeProto, index: int, role: str, count: int,
                       unit: str) -> None:
    """Check that input ``index`` of ``node`` (a constant) holds one value per ``unit``."""
    name = node.input[index]
    shape = list(np.shape(b.onnx_constants[name]))
    if shape != [count]:
        raise ModelError(f"{node.op_type} '{node.name}' has {role} '{name}' of shape {shape}; it "
                         f"must have shape [{count}] (one value per {unit})")


def _input_4d(b: _Builder, node: onnx.NodeProto, what: str) -> "tuple[str, tuple[int, ...]]":
    x = b.value(node.input[0])
    shape = b.shape(x)
    if len(shape) != 4:
        raise ModelError(f"{node.op_type} '{node.name}' must be a 2-D {what} (4-D input), not "
                         f"{len(shape) - 2}-D")
    return x, shape


#: Attributes of a layer-like node (Conv, Dense, Add, AvgPool) before any fusion.
_ACTIVATION = {"relu": False, "act_max": None}


def _conv(b: _Builder, node: onnx.NodeProto) -> Node:
    x, shape = _input_4d(b, node, "convolution")
    attrs = _attrs(node)
    weight = b.onnx_constants[node.input[1]]
    kernel = tuple(attrs.get("kernel_shape", weight.shape[2:]))
    if kernel != tuple(weight.shape[2:]):
        raise ModelError(f"Conv '{node.name}' has kernel_shape {list(kernel)}, but its weight "
                         f"has shape {list(weight.shape)}")
    group = int(attrs.get("group", 1))
    if group < 1 or shape[1] % group or weight.shape[0] % group \
            or weight.shape[1] * group != shape[1]:
        raise ModelError(f"Conv '{node.name}' has group={group}, which does not fit its input "
                         f"of {shape[1]} channels and its weight of shape {list(weight.shape)} "
                         f"(it needs input channels = group x weight.shape[1] and output "
                         f"channels divisible by group)")
    strides = tuple(attrs.get("strides", (1, 1)))
    dilations = tuple(attrs.get("dilations", (1, 1)))
    pads = _explicit_pads(node, attrs, shape[2:], kernel, strides, dilations)
    _check_windows(b, node, shape, kernel, strides, pads, dilations)
    inputs = [x, b.constant(node, node.input[1])]
    if len(node.input) > 2 and node.input[2]:
        _check_per_channel(b, node, 2, "bias", weight.shape[0], "output channel")
        inputs.append(b.constant(node, node.input[2]))
    return Node(node.name, "Conv", inputs, (b.value(node.output[0]),),
                {"strides": strides, "pads": pads, "dilations": dilations, "group": group,
                 **_ACTIVATION})


def _average_pool(b: _Builder, node: onnx.NodeProto) -> Node:
    x, shape = _input_4d(b, node, "pooling")
    attrs = _attrs(node)
    if attrs.get("ceil_mode", 0):
        raise ModelError(f"AveragePool '{node.name}' has ceil_mode=1; only ceil_mode=0 (output "
                         f"size rounded down) is supported")
    kernel = tuple(attrs["kernel_shape"])
    dilations = tuple(attrs.get("dilations", (1, 1)))
    if dilations != (1, 1):
        raise ModelError(f"AveragePool '{node.name}' has dilations {list(dilations)}; only "
                         f"dilations [1, 1] are supported")
    strides = tuple(attrs.get("strides", (1, 1)))
    pads = _explicit_pads(node, attrs, shape[2:], kernel, strides, dilations)
    if any(p >= k for p, k in zip(pads, kernel * 2)):
        raise ModelError(f"AveragePool '{node.name}' has pads {list(pads)}; each must be "
                         f"smaller than the kernel {list(kernel)} (a window must not lie "
                         f"entirely in the padding)")
    _check_windows(b, node, shape, kernel, strides, pads, dilations)
    return Node(node.name, "AvgPool", (x,), (b.value(node.output[0]),),
                {"kernel": kernel, "strides": strides, "pads": pads,
                 "count_include_pad": bool(attrs.get("count_include_pad", 0)), **_ACTIVATION})


def _max_pool(b: _Builder, node: onnx.NodeProto) -> Node:
    x, shape = _input_4d(b, node, "pooling")
    attrs = _attrs(node)
    if len(node.output) > 1 and node.output[1]:
        raise _unsupported(b, node, (
            f"MaxPool '{node.name}' has an Indices output '{node.output[1]}'; only the pooled "
            f"values have a hardware mapping"))
    if attrs.get("ceil_mode", 0):
        raise ModelError(f"MaxPool '{node.name}' has ceil_mode=1; only ceil_mode=0 (output "
                         f"size rounded down) is supported")
    kernel = tuple(attrs["kernel_shape"])
    dilations = tuple(attrs.get("dilations", (1, 1)))
    strides = tuple(attrs.get("strides", (1, 1)))
    pads = _explicit_pads(node, attrs, shape[2:], kernel, strides, dilations)
    _check_windows(b, node, shape, kernel, strides, pads, dilations)
    if not all(windows_touch_input(size, k, s, begin, end, d) for size, k, s, begin, end, d
               in zip(shape[2:], kernel, strides, pads[:2], pads[2:], dilations)):
        raise ModelError(f"MaxPool '{node.name}' has pads {list(pads)}; with kernel "
                         f"{list(kernel)} and dilations {list(dilations)} a window would lie "
                         f"entirely in the padding of its {list(shape[2:])} input")
    return Node(node.name, "MaxPool", (x,), (b.value(node.output[0]),),
                {"kernel": kernel, "strides": strides, "pads": pads, "dilations": dilations,
                 **_ACTIVATION})


def _global_max_pool(b: _Builder, node: onnx.NodeProto) -> Node:
    x, shape = _input_4d(b, node, "pooling")
    return Node(node.name, "MaxPool", (x,), (b.value(node.output[0]),),
                {"kernel": tuple(shape[2:]), "strides": (1, 1), "pads": (0, 0, 0, 0),
                 "dilations": (1, 1), **_ACTIVATION})


def _global_average_pool(b: _Builder, node: onnx.NodeProto) -> Node:
    x, shape = _input_4d(b, node, "pooling")
    return Node(node.name, "AvgPool", (x,), (b.value(node.output[0]),),
                {"kernel": tuple(shape[2:]), "strides": (1, 1), "pads": (0, 0, 0, 0),
                 "count_include_pad": True, **_ACTIVATION})


def _dense_input(b: _Builder, node: onnx.NodeProto) -> str:
    x = b.value(node.input[0])
    if len(b.shape(x)) != 2 or b.shape(x)[0] != 1:
        raise ModelError(f"{node.op_type} '{node.name}' must read a [1, K] input, not "
                         f"{list(b.shape(x))}; it maps to Dense, which computes one row")
    return x


def _gemm(b: _Builder, node: onnx.NodeProto) -> Node:
    attrs = _attrs(node)
    if attrs.get("transA", 0):
        raise ModelError(f"Gemm '{node.name}' must have transA=0, not transA=1; its run-time "
                         f"operand A cannot be transposed")
    x = _dense_input(b, node)
    weight = b.array(node, node.input[1])
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if attrs.get("transB", 0):
        weight = weight.T
    n = weight.shape[1]
    if attrs.get("transB", 0) or alpha != 1.0:
        w_name = b.new_constant(f"{node.name}_weight", weight * np.float32(alpha))
    else:
        w_name = b.constant(node, node.input[1])
    inputs = [x, w_name]
    if len(node.input) > 2 and node.input[2]:
        c = b.array(node, node.input[2])
        if c.shape not in ((n,), (1, n)):
            raise ModelError(f"Gemm '{node.name}' must have C of shape [{n}] or [1, {n}], not "
                             f"{list(c.shape)}")
        inputs.append(b.constant(node, node.input[2]) if c.shape == (n,) and beta == 1.0 else
                      b.new_constant(f"{node.name}_bias", c.reshape(n) * np.float32(beta)))
    return Node(node.name, "Dense", inputs, (b.value(node.output[0]),), dict(_ACTIVATION))


def _matmul(b: _Builder, node: onnx.NodeProto) -> Node:
    x = _dense_input(b, node)
    if b.onnx_constants[node.input[1]].ndim != 2:
        raise ModelError(f"MatMul '{node.name}' must have a 2-D second operand, not "
                         f"{list(b.onnx_constants[node.input[1]].shape)}")
    return Node(node.name, "Dense", (x, b.constant(node, node.input[1])),
                (b.value(node.output[0]),), dict(_ACTIVATION))


def _add(b: _Builder, node: onnx.NodeProto) -> Node:
    a, c = node.input
    if a not in b.onnx_constants and c not in b.onnx_constants \
            and b.shape(b.value(a)) != b.shape(b.value(c)) \
            and eltwise_shapes(b.shape(b.value(a)), b.shape(b.value(c))) is None:
        return convert_eltwise(b, node)      # per-channel broadcast: the element-wise engine
    if a in b.onnx_constants:                # constant second, the form fuse-bias looks for
        a, c = c, a
    c = b.constant(node, c) if c in b.onnx_constants else b.value(c)
    return Node(node.name, "Add", (b.value(a), c), (b.value(node.output[0]),),
                dict(_ACTIVATION))


def _relu(b: _Builder, node: onnx.NodeProto) -> Node:
    return Node(node.name, "Relu", (b.value(node.input[0]),), (b.value(node.output[0]),))


def _table_activation(b: _Builder, node: onnx.NodeProto) -> Node:
    """A table operator of :data:`hwonnx.ir.tables.TABLE_OPS` (``LeakyRelu``, ``Sigmoid``,
    ``Elu``, ``Gelu``, ...): an elementwise function the accelerator computes by a lookup table
    on the int8 value. Its attributes, ONNX's defaults filled in, are kept."""
    table = TABLE_OPS[node.op_type]
    attrs = dict(table.defaults)
    for key, value in _attrs(node).items():
        if key not in table.defaults:
            continue
        if isinstance(table.defaults[key], str):
            if value not in table.choices.get(key, (table.defaults[key],)):
                allowed = " or ".join(f"'{c}'" for c in table.choices.get(key, ()))
                raise ModelError(f"{node.op_type} '{node.name}' has {key}='{value}'; ONNX "
                                 f"defines {allowed}")
            attrs[key] = str(value)
        else:
            attrs[key] = float(value)
    return Node(node.name, node.op_type, (b.value(node.input[0]),), (b.value(node.output[0]),),
                attrs)


def _clip_bound(b: _Builder, node: onnx.NodeProto, index: int, attrs: dict, key: str,
                lower: bool) -> "float | None":
    """Return the ``min`` (``lower``) or ``max`` bound of a Clip, None when it is absent or
    unbounded (-inf / the lowest float for ``min``, +inf / the largest float for ``max``)."""
    limit = float(np.finfo(np.float32).max)
    if len(node.input) > index and node.input[index]:
        raw = np.asarray(b.onnx_constants[node.input[index]])
        if raw.size != 1 or (raw.dtype.kind != "f" and str(raw.dtype) != "bfloat16"):
            raise ModelError(f"Clip '{node.name}' needs a floating-point scalar {key}, not "
                             f"{raw.dtype} of shape {list(raw.shape)}")
        value = float(raw.reshape(-1)[0])
        if raw.dtype.kind == "f":                         # float16's largest value is 65504
            limit = min(limit, float(np.finfo(raw.dtype).max))
    elif key in attrs:                                    # opset < 11
        value = float(attrs[key])
    else:
        return None
    if math.isnan(value):
        raise ModelError(f"Clip '{node.name}' has {key}=NaN")
    if (lower and value <= -limit) or (not lower and value >= limit):
        return None
    if not math.isfinite(value):
        raise ModelError(f"Clip '{node.name}' has {key}={value}, which clips every value")
    return value


def _clip(b: _Builder, node: onnx.NodeProto) -> Node:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    low = _clip_bound(b, node, 1, attrs, "min", lower=True)
    high = _clip_bound(b, node, 2, attrs, "max", lower=False)
    x, y = b.value(node.input[0]), b.value(node.output[0])
    if low is None and high is None:
        return Node(node.name, "Identity", (x,), (y,))
    return Node(node.name, "Clip", (x,), (y,), {"min": low, "max": high})


def _softmax(b: _Builder, node: onnx.NodeProto) -> Node:
    x = b.value(node.input[0])
    rank = len(b.shape(x))
    axis = _attrs(node).get("axis", -1)                  # opset >= 13 (older is converted)
    if not -rank <= axis < rank:
        raise ModelError(f"Softmax '{node.name}' has axis={axis}, out of range for its "
                         f"rank-{rank} input")
    return Node(node.name, "Softmax", (x,), (b.value(node.output[0]),),
                {"axis": axis + rank if axis < 0 else axis})


def _check_unused(b: _Builder, node: onnx.NodeProto, what: str) -> None:
    extra = [value for value in node.output[1:] if value and value in b.used]
    if extra:
        raise ModelError(f"{node.op_type} '{node.name}' output '{extra[0]}' ({what}) must be "
                         f"unused; hwonnx runs inference only")


def _batchnorm(b: _Builder, node: onnx.NodeProto) -> Node:
    attrs = _attrs(node)
    if attrs.get("training_mode", 0):
        raise ModelError(f"BatchNormalization '{node.name}' must have training_mode=0, not 1; "
                         f"hwonnx runs inference only")
    _check_unused(b, node, "a training statistic")
    shape = b.shape(node.input[0])
    channels = shape[1] if len(shape) > 1 else 1
    for index, role in enumerate(("scale", "B", "input_mean", "input_var"), start=1):
        _check_per_channel(b, node, index, role, channels, "channel")
    epsilon = float(attrs.get("epsilon", 1e-5))
    if not np.all(np.asarray(b.onnx_constants[node.input[4]], np.float64) + epsilon > 0):
        raise ModelError(f"BatchNormalization '{node.name}' has input_var '{node.input[4]}' "
                         f"with variance + epsilon <= 0 (or NaN); it must be > 0")
    inputs = [b.value(node.input[0])] + [b.constant(node, v) for v in node.input[1:5]]
    return Node(node.name, "BatchNorm", inputs, (b.value(node.output[0]),), {"epsilon": epsilon})


def _flatten(b: _Builder, node: onnx.NodeProto) -> Node:
    x = b.value(node.input[0])
    axis = _attrs(node).get("axis", 1)
    axis = axis + len(b.shape(x)) if axis < 0 else axis
    return Node(node.name, "Flatten", (x,), (b.value(node.output[0]),), {"axis": axis})


def _reshape(b: _Builder, node: onnx.NodeProto) -> Node:
    x = b.value(node.input[0])
    source = b.shape(x)
    target = [int(v) for v in b.onnx_constants[node.input[1]]]
    if not _attrs(node).get("allowzero", 0):
        target = [source[i] if v == 0 else v for i, v in enumerate(target)]
    if -1 in target:
        known = math.prod(v for v in target if v != -1)
        target[target.index(-1)] = math.prod(source) // known if known else 0
    out = b.value(node.output[0])
    if tuple(target) != b.shape(out) or math.prod(target) != math.prod(source):
        raise ModelError(f"Reshape '{node.name}' resolves its shape to {target}, which does not "
                         f"match input {list(source)} and output {list(b.shape(out))}")
    return Node(node.name, "Reshape", (x,), (out,), {"shape": tuple(target)})


def _identity(b: _Builder, node: onnx.NodeProto) -> Node:
    return Node(node.name, "Identity", (b.value(node.input[0]),), (b.value(node.output[0]),))


def _dropout(b: _Builder, node: onnx.NodeProto) -> Node:
    _check_unused(b, node, "the dropout mask")
    training = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if training and bool(np.asarray(b.onnx_constants[training]).reshape(-1)[0]):
        raise ModelError(f"Dropout '{node.name}' must have training_mode false, not true; "
                         f"hwonnx runs inference only")
    return _identity(b, node)


def _unsupported(b: _Builder, node: onnx.NodeProto, reason: str) -> UnsupportedOperatorError:
    """Return the error refusing ``node`` (a form of a supported operator hwonnx cannot map)."""
    return UnsupportedOperatorError.with_reasons([(node.name, node.op_type, "", b.opset)],
                                                 [reason])


#: The largest ``K`` of a ``[1, K]`` tensor scaled per element through a diagonal ``Dense``.
DIAGONAL_MAX = 4096


def mul_maps(shape: "tuple[int, ...]", out_shape: "tuple[int, ...]",
             scale_shape: "tuple[int, ...]") -> bool:
    """Whether a ``Mul`` of a run-time ``shape`` by a constant of ``scale_shape`` maps to the
    array: a scalar or per-channel scale of a 4-D input (a depthwise 1x1 ``Conv``) or of a
    ``[1, K]`` input with ``K <= DIAGONAL_MAX`` (a diagonal ``Dense``)."""
    rank = len(shape)
    padded = tuple(scale_shape) if len(scale_shape) > rank else \
        (1,) * (rank - len(scale_shape)) + tuple(scale_shape)
    channels = shape[1] if rank >= 2 else 0
    return rank in (2, 4) and tuple(out_shape) == tuple(shape) and padded[1] in (1, channels) \
        and all(d == 1 for i, d in enumerate(padded) if i != 1) \
        and (rank == 4 or (shape[0] == 1 and channels <= DIAGONAL_MAX))


def _mul(b: _Builder, node: onnx.NodeProto) -> Node:
    a, c = node.input
    if a not in b.onnx_constants and c not in b.onnx_constants:
        return convert_eltwise(b, node)      # two computed tensors: the element-wise engine
    if a in b.onnx_constants:                 # the run-time operand first
        a, c = c, a
    x, out = b.value(a), b.value(node.output[0])
    shape, scale = b.shape(x), b.array(node, c)
    channels = shape[1] if len(shape) >= 2 else 0
    if mul_maps(shape, b.shape(out), scale.shape):
        per_channel = np.broadcast_to(scale.reshape(-1), (channels,))
        weight = b.new_constant(f"{node.name}_weight", channel_weight(shape, per_channel))
        return channel_scale_node(node.name, (x, weight), out, shape)
    raise _unsupported(b, node, (
        f"Mul '{node.name}' multiplies '{x}' of shape {list(shape)} by a constant of shape "
        f"{list(scale.shape)}; hwonnx maps only a scalar or per-channel constant ([C, 1, 1], "
        f"[1, C, 1, 1]) on a 4-D input (a depthwise 1x1 Conv) or a scalar, [K] or [1, K] "
        f"constant on a [1, K] input with K <= {DIAGONAL_MAX} (a diagonal Dense)"))


def _as_reshape(b: _Builder, node: onnx.NodeProto) -> Node:
    """``Squeeze``/``Unsqueeze`` (and a ``Transpose`` moving only size-1 axes): a ``Reshape``
    to the inferred output shape."""
    x, out = b.value(node.input[0]), b.value(node.output[0])
    if math.prod(b.shape(x)) != math.prod(b.shape(out)):
        raise ModelError(f"{node.op_type} '{node.name}' maps input {list(b.shape(x))} to output "
                         f"{list(b.shape(out))}, which has a different number of elements")
    return Node(node.name, "Reshape", (x,), (out,), {"shape": tuple(b.shape(out))})


def transpose_is_reshape(shape: "tuple[int, ...]", perm: "list[int]") -> bool:
    """Whether ``perm`` keeps the relative order of the axes of size > 1 of ``shape`` (only
    size-1 axes move, so the data order is unchanged: a reshape)."""
    moved = [axis for axis in perm if shape[axis] != 1]
    return moved == sorted(moved)


def _transpose(b: _Builder, node: onnx.NodeProto) -> Node:
    """A ``Reshape`` when only size-1 axes move; else a ``Transpose`` that the
    ``fold-transpose`` pass must remove (cancelled by another, or folded into the weights of a
    ``Dense`` after a ``Flatten``); one left is refused after the pass pipeline."""
    x = b.value(node.input[0])
    shape = b.shape(x)
    perm = tuple(int(p) for p in _attrs(node).get("perm", range(len(shape) - 1, -1, -1)))
    if transpose_is_reshape(shape, list(perm)):
        return _as_reshape(b, node)
    return Node(node.name, "Transpose", (x,), (b.value(node.output[0]),), {"perm": perm})


def _pad(b: _Builder, node: onnx.NodeProto) -> Node:
    """A transient ``Pad`` node {``pads``: (top, left, bottom, right), ``value`` if not 0},
    folded into the padding of the layers reading it by the ``fold-pad`` pass (any ``Pad``
    left is refused)."""
    x, out = b.value(node.input[0]), b.value(node.output[0])
    rank = len(b.shape(x))
    pads = [int(v) for v in np.asarray(b.onnx_constants[node.input[1]]).reshape(-1)]
    axes = list(range(rank))
    if len(node.input) > 3 and node.input[3]:
        axes = [int(a) + (rank if a < 0 else 0)
                for a in np.asarray(b.onnx_constants[node.input[3]]).reshape(-1)]
    full = [0] * (2 * rank)
    for i, axis in enumerate(axes):
        full[axis], full[axis + rank] = pads[i], pads[i + len(axes)]
    value = 0.0
    if len(node.input) > 2 and node.input[2]:
        values = np.asarray(b.onnx_constants[node.input[2]]).reshape(-1)
        if values.size != 1:
            raise ModelError(f"Pad '{node.name}': its constant_value '{node.input[2]}' must hold "
                             f"one value, not {values.size}")
        value = float(values[0])
    if rank != 4 or math.isnan(value) or value == math.inf or any(p < 0 for p in full) \
            or any(full[a] or full[a + rank] for a in (0, 1)):
        raise _unsupported(b, node, (
            f"Pad '{node.name}' pads a {rank}-D input by {full} with value {value:g}; only "
            f"non-negative constant padding (not NaN or +inf) of the two spatial axes of a 4-D "
            f"input (folded into the padding of the Conv, AveragePool or MaxPool reading it) "
            f"is supported"))
    if not any(full):
        return Node(node.name, "Identity", (x,), (out,))
    return Node(node.name, "Pad", (x,), (out,), {"pads": (full[2], full[3], full[6], full[7]),
                                                 **({"value": value} if value else {})})


#: Names of the axes a ``Concat`` cannot join, by input rank.
_AXIS_NAMES = {4: ("batch", "channel", "height", "width"), 2: ("batch", "feature")}


def _concat(b: _Builder, node: onnx.NodeProto) -> Node:
    """``Concat`` of run-time tensors: of ``[1, C_j, H, W]`` images along the channel, height
    or width axis, or of ``[1, K_j]`` vectors along axis 1 (a single input is an
    ``Identity``)."""
    constant = next((v for v in node.input if v in b.onnx_constants), None)
    if constant is not None:
        raise _unsupported(b, node, (
            f"Concat '{node.name}' joins the constant '{constant}' to values computed at run "
            f"time; only run-time inputs can be concatenated"))
    xs = [b.value(v) for v in node.input]
    out = b.value(node.output[0])
    shape = b.shape(xs[0])
    rank = len(shape)
    axis = int(_attrs(node).get("axis", 1))     # required (shape inference checks it)
    if not -rank <= axis < rank:
        raise ModelError(f"Concat '{node.name}' has axis={axis}, out of range for its rank-{rank} "
                         f"inputs")
    axis = axis + rank if axis < 0 else axis
    if rank not in _AXIS_NAMES or shape[0] != 1:
        raise _unsupported(b, node, (
            f"Concat '{node.name}' joins values of shape {list(shape)}; only [1, C, H, W] "
            f"images and [1, K] vectors can be concatenated"))
    if axis == 0 or (rank == 2 and axis != 1):
        raise _unsupported(b, node, (
            f"Concat '{node.name}' along axis {axis} ({_AXIS_NAMES[rank][axis]}) has no "
            f"hardware mapping; only the channel, height and width axes are supported"))
    if len(xs) == 1:
        return Node(node.name, "Identity", (xs[0],), (out,))
    return Node(node.name, "Concat", xs, (out,), {"axis": axis, **_ACTIVATION})


from .slicing import SLICING_CONVERTERS  # noqa: E402  (both use the helpers above)
from .upsample import UPSAMPLE_CONVERTERS  # noqa: E402

CONVERTERS: "dict[str, Callable[[_Builder, onnx.NodeProto], Node]]" = {
    "Conv": _conv, "Gemm": _gemm, "MatMul": _matmul, "Add": _add, "Relu": _relu,
    "BatchNormalization": _batchnorm, "Flatten": _flatten, "Reshape": _reshape,
    "Identity": _identity, "Dropout": _dropout, "AveragePool": _average_pool,
    "GlobalAveragePool": _global_average_pool, "Clip": _clip,
    "Mul": _mul, "Squeeze": _as_reshape, "Unsqueeze": _as_reshape, "Transpose": _transpose,
    "Pad": _pad, "Concat": _concat, "MaxPool": _max_pool, "GlobalMaxPool": _global_max_pool,
    "Sub": convert_eltwise, "Max": convert_eltwise, "Min": convert_eltwise,
    "Sum": convert_eltwise, "Mean": convert_eltwise,
    **{op: _table_activation for op, table in TABLE_OPS.items() if table.onnx},
    **UPSAMPLE_CONVERTERS, **SLICING_CONVERTERS,
}


def convert_graph(model: onnx.ModelProto, nodes: "list[onnx.NodeProto]", constants: dict,
                  types: dict, meta: "dict | None" = None,
                  special: "dict[str, Callable] | None" = None) -> Graph:
    """Build the float IR graph from the folded nodes of ``model``.

    Parameters
    ----------
    model : onnx.ModelProto
        The bound, shape-inferred model (for its signature and metadata).
    nodes : list of onnx.NodeProto
        The nodes left after constant folding, all of supported compute operators.
    constants : dict of str to numpy.ndarray
        Initializers and folded values.
    types : dict
        ``(elem_type, shape)`` of each value, from shape inference.
    meta : dict, optional
        The graph's metadata; the converter appends its notes (dtype conversions) to
        ``meta["notes"]``.
    special : dict of str to converter, optional
        Converters of particular nodes, by node name, used instead of ``CONVERTERS`` (the
        host steps, :mod:`.host`).

    Raises
    ------
    UnsupportedOperatorError
        Listing every node that uses a supported operator in a form hwonnx cannot map.
    ModelError
        If a node is malformed.
    ResourceError
        If a value, or the work of a node, exceeds hwonnx's bounds
        (:func:`hwonnx.ir.evaluate.check_node_work`).
    """
    b = _Builder(model, nodes, constants, types)
    graph = model.graph
    ir_nodes, refused, reasons = [], [], []
    for node in nodes:
        converter = (special or {}).get(node.name) or CONVERTERS.get(node.op_type)
        if converter is None:                 # the support check lets no other op through
            raise NotImplementedError(f"No converter for {node.op_type} (node '{node.name}')")
        try:
            made = converter(b, node)         # a Node, or a list of them (a Split)
        except UnsupportedOperatorError as error:     # go on: one error lists every node
            refused += error.nodes
            reasons += getattr(error, "reasons", [])
            continue
        except HwonnxError:
            if refused:          # (may follow from a refused node's output): report those
                continue
            raise
        for ir_node in made if isinstance(made, list) else [made]:
            if ir_node.op not in IR_OPS:      # every float IR op is registered: a bug
                raise NotImplementedError(f"Converter of {node.op_type} (node '{node.name}') "
                                          f"made {ir_node.op}, not in hwonnx.ir.ops.IR_OPS")
            if ir_node.op != "Pad":           # transient: fold-pad moves it into the layer
                check_node_work(ir_node, b.types)
            ir_nodes.append(ir_node)
    if refused:
        error = UnsupportedOperatorError(refused)
        error.args = (summary(error, reasons),)
        raise error
    # after the nodes: a host Cast gives an integer input its type
    inputs = tuple(b.value(value.name) for value in graph.input)
    outputs = []
    for value in graph.output:
        if value.name in constants:
            outputs.append(b.constant(None, value.name))
        else:
            outputs.append(b.value(value.name))
    meta = dict(meta or {})
    meta["notes"] = tuple(meta.get("notes", ())) + tuple(
        n for n in b.notes if n not in meta.get("notes", ()))
    return Graph(ir_nodes, inputs, tuple(outputs), b.types, b.constants, meta)
