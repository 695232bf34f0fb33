"""Host steps: the nodes at the start and at the end of a graph that run on the host, in
float32 NumPy (:mod:`hwonnx.golden.host`), instead of on the accelerator.

The rule (``docs/ir.md``, "Host steps"):

* **Start.** A *leading chain* is the run of nodes from a run-time graph input (each input has
  its own), each of a :data:`HOST_START_OPS` operator whose only run-time input is the
  previous value (the others are constants), and each the only reader of that value, which is
  no graph output. The chain's nodes up to and including the **last one without a hardware
  mapping** run on the host; that input's accelerator input is that node's output. The
  chain's nodes after it (and the whole chain when every node in it maps) run on the
  accelerator as before.
* **End.** A node of a :data:`HOST_END_OPS` operator is *at the end* when every path from its
  outputs reaches graph outputs through such nodes only (reading the value as their first
  input). Every node at the end without a hardware mapping runs on the host, and so does every
  node that reads a host value; the others (a ``Flatten`` before a ``Softmax``) stay on the
  accelerator.
* **Middle.** Any other node of a :data:`HOST_MIDDLE_OPS` operator on run-time values (a
  ``Softmax`` between layers, a ``Div`` of two computed tensors; not a ``Sub`` of two computed
  tensors, which the element-wise engine runs), and a ``Mul`` by a constant the array cannot
  scale by, is a host step between two accelerator segments (:mod:`hwonnx.quant.segments`):
  the host reads its inputs back, runs it in float32 and writes its result, quantized with its
  own calibrated parameters, into the next segment. A layout node reading the int64 indices
  of such an ``ArgMax`` or ``TopK`` runs on the host too (the accelerator reads float values
  only, quantized), as does the ``Cast`` to float that lets them feed on.
* A node that reads such indices and is neither runs on neither: :func:`host_steps` refuses
  it, naming it.
* **Token regions** (:mod:`.tokens`): a ``Concat`` that joins a constant to the tokens (the
  class token) runs on the host, between segments; the views of a region beside the host (a
  ``Gather`` or ``Slice`` of the tokens among them) run there too.
"""

import math
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto

from ..errors import ModelError, UnsupportedOperatorError
from ..ir.graph import Graph, Node, TensorType
from ..ir.ops import HOST, ir_ops, onnx_ops
from .common import FLOAT_TYPES, domain_opset, elem_type_name, is_default_domain
from .builder import NO_ACTIVATION, GraphBuilder, node_attrs
from .convert import convert_softmax, mul_maps
from .layout import transpose_is_reshape

__all__ = ["HOST_START_OPS", "HOST_END_OPS", "HOST_MIDDLE_OPS", "HOST_ONLY_OPS", "HOST_IR_OPS",
           "HOST_TOKEN_OPS", "HOST_CONVERTERS", "leading_chain", "leading_chains", "end_values",
           "at_end", "host_steps", "runs_on_neither", "check_host_steps"]

#: Operators the host runs at the start of the graph (in the leading chain).
HOST_START_OPS = onnx_ops(host_start=True)
#: Operators the host runs at the end of the graph.
HOST_END_OPS = onnx_ops(host_end=True)
#: Operators the host also runs between two accelerator segments (float32 results).
HOST_MIDDLE_OPS = onnx_ops(host_middle=True)
#: Operators with no hardware mapping at all (on run-time values): accepted at the start
#: (``Sub``, ``Div``, ``Cast``), at the end (``Softmax``, ``LogSoftmax``, ``ArgMax``, ``TopK``)
#: and, but for ``ArgMax`` and ``TopK``, between accelerator segments.
HOST_ONLY_OPS = onnx_ops(host_only=True)
#: Float IR ops that exist only as host steps (``Add`` and the layout ops are host steps too
#: when the placement says so, but they also map to the array).
HOST_IR_OPS = ir_ops(HOST)
#: Operators the host runs only as nodes of a token region (:mod:`.tokens`): a ``Concat``
#: joining a constant to the tokens, and a ``Gather`` or ``Slice`` of a host value's tokens.
HOST_TOKEN_OPS = frozenset({"Concat", "Gather", "Slice"})
_ELEMENTWISE = ("Sub", "Div", "Mul", "Add")
_START = "at the start of the graph, before the accelerator's input"
_END = "at the end of the graph, after the accelerator's output"
_MIDDLE = ("between accelerator segments: the host reads its input back and writes its result, "
           "quantized, into the next segment")


def runs_on_neither(node_name: str, op: str, why: str = "no hardware mapping, and the host "
                    "does not run it there") -> str:
    """The reason given for a node that can run on neither side."""
    return f"{op} '{node_name}' runs on neither: {why}"


def leading_chains(nodes, inputs, outputs, constant: "set[str]"
                   ) -> "list[list[onnx.NodeProto]]":
    """The leading chain (see the module docstring) of each run-time input of ``nodes``, in
    input order (an empty one where no node qualifies); ``inputs``/``outputs``: the graph's
    input and output names, ``constant``: the constant values. A chain node reads one
    run-time value only, so the chains never meet."""
    readers: "dict[str, list[onnx.NodeProto]]" = {}
    for node in nodes:
        for value in set(node.input):
            if value:
                readers.setdefault(value, []).append(node)
    chains = []
    for value in (name for name in inputs if name not in constant):
        chain = []
        while value not in outputs and len(readers.get(value, ())) == 1:
            node = readers[value][0]
            reads = [v for v in node.input if v and v not in constant]
            if not is_default_domain(node.domain) or node.op_type not in HOST_START_OPS \
                    or reads != [value] or (node.op_type not in _ELEMENTWISE
                                            and node.input[0] != value):
                break
            chain.append(node)
            value = node.output[0]
        chains.append(chain)
    return chains


def leading_chain(nodes, inputs, outputs, constant: "set[str]") -> "list[onnx.NodeProto]":
    """The nodes of every leading chain (:func:`leading_chains`)."""
    return [node for chain in leading_chains(nodes, inputs, outputs, constant)
            for node in chain]


def end_values(nodes) -> "set[str]":
    """The values every reader of which is a :data:`HOST_END_OPS` node reading it as its first
    input only, whose outputs are such values too (a value nothing reads is one)."""
    readers: "dict[str, list[onnx.NodeProto]]" = {}
    for node in nodes:
        for value in node.input:
            if value:
                readers.setdefault(value, []).append(node)
    end: "set[str]" = set()
    for node in reversed(list(nodes)):              # topological order: readers first
        for value in node.output:
            if value and all(is_default_domain(r.domain) and r.op_type in HOST_END_OPS
                             and r.input[0] == value and value not in r.input[1:]
                             and all(out in end or out not in readers
                                     for out in r.output if out)
                             for r in readers.get(value, [])):
                end.add(value)
    return end


def at_end(node: onnx.NodeProto, end: "set[str]") -> bool:
    """Whether ``node`` is at the end of the graph (``end``: :func:`end_values`)."""
    return is_default_domain(node.domain) and node.op_type in HOST_END_OPS \
        and all(out in end for out in node.output if out)


def _shape(types, value) -> "tuple[int, ...] | None":
    return types.get(value, (0, None))[1]


def _per_sample(node: onnx.NodeProto, types) -> bool:
    """Whether the first input and the outputs of ``node`` have a leading axis of size 1 (a
    host step runs sample by sample along it)."""
    return all(bool(_shape(types, v)) and _shape(types, v)[0] == 1
               for v in (node.input[0], *node.output) if v)


def _missing_mapping(node: onnx.NodeProto, chain: "list[onnx.NodeProto]", constants, types,
                     maps: "dict[str, bool]") -> "str | None":
    """None when ``node`` (of the leading chain or at the end) has a hardware mapping there,
    else the detail of why not ('' when the operator has none at all)."""
    op = node.op_type
    if op in HOST_ONLY_OPS:
        return ""
    if op == "Transpose":
        shape = _shape(types, node.input[0])
        if shape is None:
            return None                              # the converter names the missing shape
        perm = [int(p) for p in node_attrs(node).get("perm", range(len(shape) - 1, -1, -1))]
        return None if transpose_is_reshape(shape, perm) else \
            f" (perm {perm} reorders axes of size > 1 of {list(shape)})"
    if op not in _ELEMENTWISE:
        return None                                  # a layout op: the buffer is re-read
    x = next(v for v in node.input if v not in constants)
    c = next(v for v in node.input if v in constants)
    c_shape = tuple(np.shape(constants[c]))
    if op == "Mul":
        if mul_maps(_shape(types, x), _shape(types, node.output[0]), c_shape):
            return None
        return f" (a constant of shape {list(c_shape)} is neither a scalar nor per channel)"
    # Add: only folded into the bias of a per-channel Mul right before it (fuse-bias)
    before = next((n for n in chain if n.output[0] == x), None)
    shape = _shape(types, x)
    if before is not None and before.op_type == "Mul" and maps.get(before.name) \
            and shape is not None and len(shape) in (2, 4):
        n = shape[1]
        if c_shape in (((n, 1, 1), (1, n, 1, 1)) if len(shape) == 4 else ((n,), (1, n))):
            return None
    return (" (only a per-channel constant after a Conv, Gemm or per-channel Mul is folded "
            "into its bias)")


def host_steps(model: onnx.ModelProto, nodes, constants: dict, types: dict,
               views: "dict[str, str] | None" = None,
               host_only: "dict[str, str] | None" = None) -> "dict[str, dict]":
    """Decide which of the folded ``nodes`` run on the host.

    Returns ``node name -> {"at": "start" | "middle" | "end", "why": reason}`` for every host
    step (see
    the module docstring for the rule); ``constants`` and ``types`` are the folded constants
    and the inferred ``(elem_type, shape)`` of every value. ``views`` maps the nodes that
    view a value as an image (a 1-D value as one of height 1, :mod:`.onedim`; tokens as
    pixels, :mod:`.tokens`) to what they do: in the leading chain they have no hardware
    mapping (the array reads no rank-3 input). ``host_only`` maps the nodes that only the
    host runs (a token region's ``Concat`` joining a constant) to why: they are host steps
    between segments."""
    views = views or {}
    host_only = host_only or {}
    graph = model.graph
    outputs = {value.name for value in graph.output}
    steps: "dict[str, dict]" = {}
    maps: "dict[str, bool]" = {}
    details = {}
    for chain in leading_chains(nodes, [v.name for v in graph.input], outputs,
                                set(constants)):
        for node in chain:
            details[node.name] = "" if node.name in views else \
                _missing_mapping(node, chain, constants, types, maps)
            # a host step runs sample by sample, along a leading axis of size 1: an operator
            # that also has an array form stays there without one (and fails there, if it must)
            maps[node.name] = details[node.name] is None or (
                node.op_type not in HOST_ONLY_OPS and not _per_sample(node, types))
        last = max((i for i, node in enumerate(chain) if not maps[node.name]), default=-1)
        for node in chain[:last + 1]:
            if node.name in views:
                why = f"{views[node.name]}; {_START}"
            elif maps[node.name]:
                why = (f"{node.op_type} could map to the array, but {chain[last].op_type} "
                       f"'{chain[last].name}' after it cannot; {_START}")
            else:
                why = f"{node.op_type} has no hardware mapping{details[node.name]}; {_START}"
            steps[node.name] = {"at": "start", "why": why}
    end = end_values(nodes)
    host_values: "set[str]" = set()
    for node in nodes:
        if not at_end(node, end):
            continue
        detail = _missing_mapping(node, [], constants, types, {})
        if detail is not None and node.name in views:
            why = f"{views[node.name]}; {_END}"
        elif detail is not None and (node.op_type in HOST_ONLY_OPS or _per_sample(node, types)):
            why = f"{node.op_type} has no hardware mapping{detail}; {_END}"
        elif node.input[0] in host_values:
            why = f"{node.op_type} reads the host value '{node.input[0]}'; {_END}"
        else:
            continue
        steps[node.name] = {"at": "end", "why": why}
        host_values.update(v for v in node.output if v)
    indices: "dict[str, str]" = {}     # int64 host value -> the host step that made it
    neither: "list[tuple[onnx.NodeProto, str]]" = []
    for node in nodes:
        reads = [v for v in node.input if v and v not in constants]
        index = next((v for v in reads if v in indices), None)
        if index is not None and node.name not in steps:
            if not is_default_domain(node.domain) or node.op_type not in HOST_END_OPS | {"Cast"}:
                neither.append((node, f"it reads the int64 indices '{index}' of "
                                      f"{indices[index]}, but the accelerator reads only float "
                                      f"values (a Cast to float before it would do) and the "
                                      f"host runs only Cast and layout nodes on indices"))
                continue
            steps[node.name] = {"at": "middle", "why": (
                f"{node.op_type} reads the int64 indices '{index}' of {indices[index]}; "
                f"{_MIDDLE}")}
            if node.op_type != "Cast":
                indices.update((v, indices[index]) for v in node.output if v)
            continue
        if node.name in steps or not is_default_domain(node.domain) or not reads:
            continue
        if node.name in host_only:
            steps[node.name] = {"at": "middle", "why": f"{host_only[node.name]}; {_MIDDLE}"}
            continue
        detail = ""
        if node.op_type == "Mul" and len(reads) == 1:    # a constant the array cannot scale by
            detail = _missing_mapping(node, [], constants, types, {})
            if detail is None or not _per_sample(node, types):
                continue
        elif node.op_type not in HOST_MIDDLE_OPS \
                or (node.op_type == "Sub" and len(reads) == 2):     # the element-wise engine's
            continue
        steps[node.name] = {"at": "middle",
                            "why": f"{node.op_type} has no hardware mapping{detail}; {_MIDDLE}"}
        if node.op_type in ("ArgMax", "TopK"):
            out = node.output[0 if node.op_type == "ArgMax" else 1]
            if out:
                indices[out] = f"{node.op_type} '{node.name}'"
    _views_beside_the_host(nodes, views, steps, {v.name for v in graph.input})
    if neither:
        error = UnsupportedOperatorError([(n.name, n.op_type, n.domain,
                                           domain_opset(model, n.domain)) for n, _ in neither])
        reasons = "; ".join(runs_on_neither(n.name, n.op_type, why) for n, why in neither)
        error.args = (f"{error} ({reasons})",)
        raise error
    return steps


def _views_beside_the_host(nodes, views: "dict[str, str]", steps: dict,
                           inputs: "set[str]") -> None:
    """Make the views (``views``) beside the host host steps between segments, in ``steps``:
    a view reading a graph input or a host step's result, and a view whose results only host
    steps read (a ``LayerNormalization`` between token layers): the host changes the layout
    of the values it writes or reads anyway, where the array would copy them, and the array
    reads and writes no rank-3 value."""
    host = set(inputs) | {v for node in nodes if node.name in steps for v in node.output if v}
    for node in nodes:
        if node.name in views and node.name not in steps and node.input[0] in host:
            steps[node.name] = {"at": "middle", "why": (
                f"{views[node.name]} (it reads the host value '{node.input[0]}'); {_MIDDLE}")}
            host.update(v for v in node.output if v)
    readers: "dict[str, list[str]]" = {}
    for node in nodes:
        for value in node.input:
            if value:
                readers.setdefault(value, []).append(node.name)
    for node in reversed(list(nodes)):
        outputs = [v for v in node.output if v]
        if node.name in views and node.name not in steps and outputs \
                and all(readers.get(v) and all(r in steps for r in readers[v])
                        for v in outputs):
            steps[node.name] = {"at": "middle", "why": (
                f"{views[node.name]} (only host steps read it); {_MIDDLE}")}


def check_host_steps(graph: Graph, opset: int) -> None:
    """Raise one :class:`UnsupportedOperatorError` naming every host-only op of the float
    ``graph`` (after the pass pipeline) that is no host step (the support check has refused
    those already, so this guards the converters)."""
    steps = graph.meta.get("host_steps") or {}
    nodes, reasons = [], []
    for node in graph.nodes:
        if node.name not in steps and node.op in HOST_IR_OPS:
            reasons.append(runs_on_neither(node.name, node.op))
            nodes.append((node.name, node.op, "", opset))
    if nodes:
        error = UnsupportedOperatorError(nodes)
        error.args = (f"{error} ({'; '.join(reasons)})",)
        raise error


# Conversion of host steps to float IR nodes ------------------------------------------------------

def _typed(b: GraphBuilder, node: onnx.NodeProto, name: str, dtype: str = "float32") -> str:
    """Register the type of the run-time value ``name`` written or read by host step ``node``
    (float values through the converter's own check) and check its sample axis."""
    if name not in b.types:
        if dtype == "float32":
            b.value(name)
        else:
            shape = b.onnx_types.get(name, (0, None))[1]
            if shape is None:
                raise ModelError(f"Shape inference could not give '{name}' a static shape")
            b.types[name] = TensorType(dtype, shape)
    shape = b.types[name].shape
    if not shape or shape[0] != 1:
        raise ModelError(f"{node.op_type} '{node.name}' runs on the host, one sample at a time "
                         f"along a leading axis of size 1, but '{name}' has shape "
                         f"{list(shape)}")
    return name


def _elementwise(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    """``Sub``, ``Div``, ``Mul``, ``Add`` of a run-time value and a constant (either order)."""
    x = next(v for v in node.input if v not in b.onnx_constants)
    inputs = tuple(b.constant(node, v) if v in b.onnx_constants else _typed(b, node, v)
                   for v in node.input)
    out = _typed(b, node, node.output[0])
    if b.shape(out) != b.shape(x):
        raise ModelError(f"{node.op_type} '{node.name}' broadcasts '{x}' of shape "
                         f"{list(b.shape(x))} to {list(b.shape(out))}; a host step keeps the "
                         f"shape of its run-time input")
    divisor = node.input[1] if node.op_type == "Div" and len(node.input) > 1 else ""
    if divisor in b.constants:
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            inverse = np.float32(1) / np.asarray(b.constants[divisor], np.float32)
        if not np.all(np.isfinite(inverse)):
            bad = np.asarray(b.constants[divisor]).reshape(-1)[~np.isfinite(inverse).reshape(-1)]
            what = "0" if (bad == 0).any() else "NaN" if np.isnan(bad).any() else \
                f"{float(bad[0]):g}, whose reciprocal overflows float32"
            raise ModelError(f"Div '{node.name}' divides by the constant '{divisor}', which "
                             f"holds {what}; the result would not be finite")
    attrs = dict(NO_ACTIVATION) if node.op_type == "Add" else {}
    return Node(node.name, node.op_type, inputs, (out,), attrs)


def _transpose(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x = _typed(b, node, node.input[0], _dtype(b, node.input[0]))
    rank = len(b.types[x].shape)
    perm = tuple(int(p) for p in node_attrs(node).get("perm", range(rank - 1, -1, -1)))
    out = _typed(b, node, node.output[0], b.types[x].dtype)
    return Node(node.name, "Transpose", (x,), (out,), {"perm": perm})


def _cast(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    to = int(node_attrs(node)["to"])
    if to not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
        raise ModelError(f"Cast '{node.name}' converts to {elem_type_name(to)}; a Cast on the "
                         f"host must convert to float (float32, or float64, which hwonnx "
                         f"computes in float32)")
    x = _typed(b, node, node.input[0], _dtype(b, node.input[0]))     # an integer input too
    return Node(node.name, "Cast", (x,), (_typed(b, node, node.output[0]),))


def _dtype(b: GraphBuilder, value: str) -> str:
    """The IR dtype of a run-time value: int64 for indices, else float32."""
    if value in b.types:
        return b.types[value].dtype
    elem = b.onnx_types.get(value, (0, None))[0]
    return "float32" if elem in FLOAT_TYPES else elem_type_name(elem)


def _layout(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    """``Reshape``, ``Flatten``, ``Squeeze``, ``Unsqueeze`` (to the inferred output shape),
    ``Identity`` and ``Dropout`` of a host value of any dtype."""
    if node.op_type == "Dropout":
        extra = [v for v in node.output[1:] if v and v in b.used]
        if extra:
            raise ModelError(f"Dropout '{node.name}' output '{extra[0]}' (the dropout mask) "
                             f"must be unused; hwonnx runs inference only")
    x = _typed(b, node, node.input[0], _dtype(b, node.input[0]))
    out = _typed(b, node, node.output[0], b.types[x].dtype)
    if node.op_type in ("Identity", "Dropout"):
        return Node(node.name, "Identity", (x,), (out,))
    if math.prod(b.shape(x)) != math.prod(b.shape(out)):
        raise ModelError(f"{node.op_type} '{node.name}' maps input {list(b.shape(x))} to "
                         f"output {list(b.shape(out))}, which has a different number of "
                         f"elements")
    return Node(node.name, "Reshape", (x,), (out,), {"shape": tuple(b.shape(out))})


def _axis(node: onnx.NodeProto, attrs: dict, rank: int, default: int) -> int:
    axis = int(attrs.get("axis", default))
    if not -rank <= axis < rank:
        raise ModelError(f"{node.op_type} '{node.name}' has axis={axis}, out of range for its "
                         f"rank-{rank} input")
    return axis + rank if axis < 0 else axis


def _softmax_like(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    """``Softmax`` (the converter of the float IR op) and ``LogSoftmax`` (the same form)."""
    _typed(b, node, node.input[0])
    _typed(b, node, node.output[0])
    return convert_softmax(b, node) if node.op_type == "Softmax" else \
        Node(node.name, "LogSoftmax", (node.input[0],), (node.output[0],),
             {"axis": _axis(node, node_attrs(node), len(b.shape(node.input[0])), -1)})


def _argmax(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x = _typed(b, node, node.input[0])
    attrs = node_attrs(node)
    out = _typed(b, node, node.output[0], "int64")
    return Node(node.name, "ArgMax", (x,), (out,),
                {"axis": _axis(node, attrs, len(b.shape(x)), 0),
                 "keepdims": int(attrs.get("keepdims", 1)),
                 "select_last_index": int(attrs.get("select_last_index", 0))})


def _topk(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x = _typed(b, node, node.input[0])
    attrs = node_attrs(node)
    axis = _axis(node, attrs, len(b.shape(x)), -1)
    k = np.asarray(b.onnx_constants[node.input[1]]).reshape(-1)
    size = b.shape(x)[axis]
    if k.size != 1 or not 1 <= int(k[0]) <= size:
        raise ModelError(f"TopK '{node.name}' has K={k.tolist()}; it must be one value from 1 "
                         f"to {size}, the size of axis {axis}")
    values = _typed(b, node, node.output[0])
    indices = _typed(b, node, node.output[1], "int64")
    return Node(node.name, "TopK", (x,), (values, indices),
                {"k": int(k[0]), "axis": axis, "largest": int(attrs.get("largest", 1)),
                 "sorted": int(attrs.get("sorted", 1))})


def _layernorm(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    """``LayerNormalization`` with constant scale and bias, its statistics outputs unused."""
    x = _typed(b, node, node.input[0])
    attrs = node_attrs(node)
    axis = _axis(node, attrs, len(b.shape(x)), -1)
    if axis == 0:
        raise ModelError(f"LayerNormalization '{node.name}' normalizes over the batch axis")
    if int(attrs.get("stash_type", 1)) != TensorProto.FLOAT:
        raise ModelError(f"LayerNormalization '{node.name}' has stash_type "
                         f"{attrs['stash_type']}; hwonnx computes its statistics in float32 "
                         f"(stash_type 1)")
    params = []
    for index, role in ((1, "scale"), (2, "B")):
        if index < len(node.input) and node.input[index]:
            if node.input[index] not in b.onnx_constants:
                raise ModelError(f"LayerNormalization '{node.name}' needs a constant {role}, "
                                 f"but '{node.input[index]}' is computed at run time")
            params.append(b.constant(node, node.input[index]))
    extra = [value for value in node.output[1:] if value and value in b.used]
    if extra:
        raise ModelError(f"LayerNormalization '{node.name}' output '{extra[0]}' (a statistic) "
                         f"must be unused")
    out = _typed(b, node, node.output[0])
    return Node(node.name, "LayerNorm", (x, *params), (out,),
                {"axis": axis, "epsilon": float(attrs.get("epsilon", 1e-5))})


def _concat(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    """``Concat`` of a token region's images and constants (the class token), along the
    height (:mod:`.tokens`)."""
    inputs = tuple(b.constant(node, v) if v in b.onnx_constants else _typed(b, node, v)
                   for v in node.input)
    out = _typed(b, node, node.output[0])
    axis = _axis(node, node_attrs(node), len(b.shape(out)), 1)
    return Node(node.name, "Concat", inputs, (out,), {"axis": axis, **NO_ACTIVATION})


def _gather(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    """``Gather`` (constant indices) or ``Slice`` (constant window) of a token region's image
    along the tokens (:mod:`.tokens`): the host ``Gather`` of those indices."""
    x = _typed(b, node, node.input[0])
    shape = b.shape(x)
    out = _typed(b, node, node.output[0])
    if node.op_type == "Gather":
        axis = _axis(node, node_attrs(node), len(shape), 0)
        indices = [int(i) + (shape[axis] if i < 0 else 0)
                   for i in np.asarray(b.onnx_constants[node.input[1]]).reshape(-1)]
    else:
        starts, axes = (np.asarray(b.onnx_constants[node.input[i]]).reshape(-1)
                        for i in (1, 3))
        axis = int(axes[0]) + (len(shape) if axes[0] < 0 else 0)
        indices = list(range(int(starts[0]), int(starts[0]) + b.shape(out)[axis]))
    if not all(0 <= i < shape[axis] for i in indices) \
            or b.shape(out) != (*shape[:axis], len(indices), *shape[axis + 1:]):
        raise ModelError(f"{node.op_type} '{node.name}' picks {indices[:8]} along axis {axis} "
                         f"of its input of shape {list(shape)}, which does not give its "
                         f"output of shape {list(b.shape(out))}")
    return Node(node.name, "Gather", (x,), (out,), {"axis": axis, "indices": tuple(indices)})


#: Converters of the host steps, by ONNX operator (used instead of ``CONVERTERS`` for the
#: nodes :func:`host_steps` places on the host): those of :data:`HOST_START_OPS`,
#: :data:`HOST_END_OPS` and :data:`HOST_TOKEN_OPS`.
HOST_CONVERTERS: "dict[str, Callable[[GraphBuilder, onnx.NodeProto], Node]]" = {
    "Sub": _elementwise, "Div": _elementwise, "Mul": _elementwise, "Add": _elementwise,
    "Transpose": _transpose, "Cast": _cast, "Reshape": _layout, "Flatten": _layout,
    "Squeeze": _layout, "Unsqueeze": _layout, "Identity": _layout, "Dropout": _layout,
    "Softmax": _softmax_like, "LogSoftmax": _softmax_like, "ArgMax": _argmax, "TopK": _topk,
    "LayerNormalization": _layernorm, "Concat": _concat, "Gather": _gather, "Slice": _gather,
}
