"""The frontend entry point: read, validate, inline, check support, convert opsets, bind,
infer, fold, convert. See ``docs/spec.md`` for the ONNX IR rule each step implements."""

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from ..errors import ModelError
from ..ir.graph import Graph
from ..passes.pipeline import FLOAT_PIPELINE, PassContext, run_pipeline
from .common import ReadLog, domain_opset, elem_type_name, is_default_domain
from .control import dead_nodes, prune_dead_nodes, resolve_constant_ifs
from .convert import convert_graph
from .fold import fold_constants, release_initializers, remove_dead_nodes
from .functions import inline_functions
from .graph_rules import check_graph
from .batch import check_unbatched, unbatch
from .host import HOST_CONVERTERS, check_host_steps, host_steps
from .onedim import view_1d
from .opsets import check_signatures, convert_opset
from .patterns import find_unary_patterns, pattern_converters
from .annotate import Annotations
from .prequant import annotate_graph, dequantize_model, is_prequantized
from .qdq_batchnorm import fold_integer_batchnorm
from .qonnx import import_missing_domains, is_qonnx, rewrite_qonnx
from .read import read_model
from .shapes import (apply_overrides, bind_input_shapes, infer_folded_shapes, infer_shapes,
                     value_types)
from .sparse import densify_sparse
from .tokens import view_tokens
from .support import check_fused, check_support
from .validate import resolve_operators, validate_model

__all__ = ["ImportedModel", "finish_import", "import_model", "load_model", "read_model",
           "model_meta"]


@dataclass(frozen=True)
class ImportedModel:
    """A model as :func:`import_model` reads it, before the float passes: the float ``graph``,
    the passes' ``context`` (a pre-quantized model's quantized values added) and, of a
    pre-quantized model, its ``annotations`` (:class:`.annotate.Annotations`)."""
    graph: Graph
    context: PassContext
    annotations: "Annotations | None" = None


def load_model(path_or_model: "str | Path | bytes | onnx.ModelProto",
               input_shapes: "dict[str, tuple[int, ...]] | None" = None,
               override_initializers: "dict[str, np.ndarray] | None" = None,
               *, pass_context: "PassContext | None" = None) -> Graph:
    """Import an ONNX model as a verified float IR graph: :func:`import_model`, the float
    passes, then :func:`finish_import` (``hwonnx build`` runs the three as steps of
    :data:`hwonnx.pipeline.BUILD_STEPS`).

    The model is read (external data only from inside the model's folder), checked against
    the ONNX IR rules, its model-local functions are inlined and each ``If`` with a constant
    condition is replaced by its branch; then it is checked for support (before any other
    processing, so that every unsupported node is reported at once) and against operator
    signatures, converted to a supported opset if older, its symbolic dimensions are bound,
    shapes are inferred, constant subgraphs are folded, 1-D convolution and pooling are
    viewed as 2-D of height 1 (:mod:`.onedim`) and token-wise MatMuls as 1x1 convolutions
    over the tokens (:mod:`.tokens`), and the result is converted to the
    float vocabulary of :mod:`hwonnx.ir.graph` and run through
    :data:`hwonnx.passes.FLOAT_PIPELINE`; a ``Clip`` the pipeline could not fuse into the
    layer before it is then refused. A model already quantized by onnxruntime (QDQ or
    QOperator) is first rewritten into the float model it encodes, right before the support
    check (:mod:`.prequant`); its quantization parameters end up in
    ``graph.meta["quantization"]`` (:func:`.annotate.annotate_graph`).

    Parameters
    ----------
    path_or_model : str, Path, bytes or onnx.ModelProto
        The model file, its bytes or the model itself (which is not modified). External
        tensor data can only be read when a path is given.
    input_shapes : dict of str to tuple of int, optional
        Full shapes of graph inputs; binds their symbolic dimensions. A symbolic leading
        (batch) dimension binds to 1 unless given here.
    override_initializers : dict of str to numpy.ndarray, optional
        Values replacing the initializer defaults of graph inputs (same shape and dtype).
        Initialized inputs become constants either way.
    pass_context : PassContext, optional
        Debugging switches (IR dumps, skipped passes) for the pass pipeline.

    Returns
    -------
    Graph
        The float graph; its graph inputs and outputs keep their ONNX names. ``graph.meta``
        holds the model's metadata, the declared and bound signature, and the frontend's
        ``notes`` and ``warnings`` (see :func:`model_meta`).

    Raises
    ------
    ModelError
        If the model cannot be read, breaks an ONNX IR rule, has unbound or contradictory
        dimensions, or uses a supported operator in a form hwonnx cannot map.
    UnsupportedOperatorError
        If any node uses an unsupported operator (lists all of them), a ``Softmax`` is not at
        the end of the graph, or a ``Clip`` cannot be fused; or a convolution or pooling is
        neither 1-D nor 2-D or a supported operator comes in a form without a mapping (each
        such group lists all of its nodes).
    ResourceError
        If a value, the work of a node or of folding exceeds hwonnx's limits (``docs/spec.md``,
        "Limits"); the message names the node or value and its size.
    """
    imported = import_model(path_or_model, input_shapes, override_initializers,
                            pass_context=pass_context)
    return finish_import(imported, run_pipeline(imported.graph, FLOAT_PIPELINE,
                                                imported.context))


def import_model(path_or_model: "str | Path | bytes | onnx.ModelProto",
                 input_shapes: "dict[str, tuple[int, ...]] | None" = None,
                 override_initializers: "dict[str, np.ndarray] | None" = None,
                 *, pass_context: "PassContext | None" = None) -> ImportedModel:
    """:func:`load_model` up to the float passes, which it leaves to the caller (parameters
    and errors as :func:`load_model`'s)."""
    rlog = ReadLog()
    model = read_model(path_or_model)
    densify_sparse(model, rlog)
    validate_model(model, rlog)
    import_missing_domains(model, rlog)         # QONNX tools often omit their domains
    resolve_operators(model)
    meta = model_meta(model)
    del model.training_info[:]                      # ignored (noted by validate_model)
    inlined = inline_functions(model, rlog)
    if resolve_constant_ifs(inlined, rlog) or inlined is not model:
        check_graph(inlined.graph, rlog, warn=False)
        resolve_operators(inlined)
    model, inlined = inlined, None
    check_signatures(model, dead_nodes(model))     # every node, used or not: those dropped now
    prune_dead_nodes(model)
    annotations = None
    qonnx = rewrite_qonnx(model, rlog) if is_qonnx(model) else None   # QONNX -> QCDQ
    if is_prequantized(model):                  # onnxruntime QDQ / QOperator model
        annotations = dequantize_model(model)
        fold_integer_batchnorm(model, annotations, rlog)   # keeps the integer weights
        if qonnx is not None:
            annotations.source = "qonnx"
            annotations.quantizers, annotations.half_up, annotations.signs = qonnx
        prune_dead_nodes(model)
    patterns = find_unary_patterns(model.graph)
    inner = frozenset(name for fused in patterns.values() for name in fused.inner)
    check_support(model, inner)
    check_signatures(model)
    model = convert_opset(model, rlog)
    bound = bind_input_shapes(model, input_shapes)
    for name in override_initializers or {}:
        rlog.note(f"Initializer '{name}' overridden by a value given by the user")
    apply_overrides(model, override_initializers)
    ir_version = model.ir_version
    model.ir_version = max(ir_version, 4)   # before IR 4, initializers had to be inputs too
    batches, batched_shapes = unbatch(model, rlog)
    model = infer_shapes(model)
    check_unbatched(model, batched_shapes)
    model.ir_version = ir_version
    types = value_types(model)
    _check_layout_attributes(model.graph.node, types)
    outputs = {value.name for value in model.graph.output}
    live = remove_dead_nodes(list(model.graph.node), outputs)
    nodes, constants = fold_constants(model, types, live)
    nodes = remove_dead_nodes(nodes, outputs)
    types = infer_folded_shapes(model, nodes, constants, types)
    # the initializers are arrays now: drop the protobuf holding them (peak memory)
    model, nodes = release_initializers(model, nodes)
    live = None
    nodes, views = view_1d(nodes, constants, types, domain_opset(model, ""), outputs,
                           annotations)
    nodes, token_views, renamed, host_only = view_tokens(nodes, constants, types, outputs,
                                                         inner, annotations)
    views = {**views, **token_views}
    patterns = {last: replace(fused, x=renamed.get(fused.x, fused.x))
                for last, fused in patterns.items()}
    steps = {name: step for name, step in host_steps(model, nodes, constants, types,
                                                     views, host_only).items()
             if name not in inner}
    meta.update(notes=tuple(rlog.notes), warnings=tuple(rlog.warnings), dim_bindings=bound,
                **({"batches": batches} if batches else {}),
                **({"host_steps": steps} if steps else {}))
    graph = convert_graph(model, nodes, constants, types, meta, {
        **{node.name: HOST_CONVERTERS[node.op_type] for node in nodes if node.name in steps},
        **pattern_converters(patterns)})
    meta = dict(graph.meta)
    for key, values in (("inputs", graph.inputs), ("outputs", graph.outputs)):
        meta[key] = tuple({**declared, "shape": list(graph.types[declared["name"]].shape)}
                          for declared in meta[key] if declared["name"] in values)
    graph = replace(graph, meta=meta)
    context = pass_context or PassContext()
    if annotations is not None:
        context = replace(context, quantized=frozenset(annotations.activations))
    return ImportedModel(graph, context, annotations)


def finish_import(imported: ImportedModel, graph: Graph) -> Graph:
    """``graph`` (``imported.graph`` after the float passes) checked: a ``Clip`` the passes
    could not fuse and a host step in a place the host cannot run it are refused
    (:class:`~hwonnx.errors.UnsupportedOperatorError`); a pre-quantized model's
    quantization parameters go into ``graph.meta["quantization"]``."""
    opset = imported.graph.meta["opset"]
    check_fused(graph, opset)
    check_host_steps(graph, opset)
    if imported.annotations is not None:
        graph = annotate_graph(graph, imported.annotations)
    return graph


def _check_layout_attributes(nodes, types: dict) -> None:
    """Refuse a ``Transpose`` whose ``perm`` is not a permutation of its input's axes, and a
    ``Flatten`` whose ``axis`` is outside [-r, r] for its rank-r input (onnx's shape inference
    lets both through: the first when the output's shape is declared, the second when the
    axis does not fit in 32 bits)."""
    for node in nodes:
        shape = types.get(node.input[0], (0, None))[1] if node.input else None
        if node.op_type not in ("Transpose", "Flatten") or not is_default_domain(node.domain) \
                or shape is None:
            continue
        if node.op_type == "Flatten":
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            if not -len(shape) <= axis <= len(shape):
                raise ModelError(f"Flatten '{node.name}' has axis={axis}, out of range for its "
                                 f"rank-{len(shape)} input '{node.input[0]}' (ONNX: axis is "
                                 f"in [-r, r] for an input of rank r)")
            continue
        perms = [list(a.ints) for a in node.attribute if a.name == "perm"]
        if perms and sorted(perms[0]) != list(range(len(shape))):
            raise ModelError(f"Transpose '{node.name}' has perm {perms[0]}, which is not a "
                             f"permutation of the {len(shape)} axes of its input "
                             f"'{node.input[0]}' of shape {list(shape)} (ONNX: perm lists "
                             f"every axis once)")


def _dims(value: onnx.ValueInfoProto) -> str:
    dims = value.type.tensor_type.shape.dim
    if not dims:
        return "scalar"
    return "x".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
                    for d in dims)


def model_meta(model: onnx.ModelProto) -> dict:
    """Return the metadata hwonnx carries into ``Graph.meta`` and the build report.

    Keys: ``ir_version``, ``opset`` (the ai.onnx version the model imports),
    ``opset_imports`` (domain -> version), ``producer_name``, ``producer_version``,
    ``domain``, ``model_version``, ``doc_string``, ``graph_name``, ``metadata_props``
    (dict), ``model_author`` and ``model_license`` (from ``metadata_props``, ``""`` when
    absent), ``inputs`` and ``outputs`` (one dict per value: ``name``, ``dtype``, ``declared``
    dims such as ``"Nx3x32x32"``; :func:`load_model` adds the bound ``shape``). ``load_model``
    adds ``notes``, ``warnings`` (tuples of str) and ``dim_bindings`` (variable -> size).
    """
    props = {p.key: p.value for p in model.metadata_props}
    initialized = {i.name for i in model.graph.initializer}
    opsets = {(o.domain if not is_default_domain(o.domain) else "ai.onnx"): int(o.version)
              for o in model.opset_import}

    def signature(values, skip=frozenset()):
        return tuple({"name": v.name, "dtype": elem_type_name(v.type.tensor_type.elem_type),
                      "declared": _dims(v)} for v in values if v.name not in skip)

    return {
        "ir_version": int(model.ir_version), "opset": opsets.get("ai.onnx", 0),
        "opset_imports": opsets, "producer_name": model.producer_name,
        "producer_version": model.producer_version, "domain": model.domain,
        "model_version": int(model.model_version), "doc_string": model.doc_string,
        "graph_name": model.graph.name, "metadata_props": props,
        "model_author": props.get("model_author", ""),
        "model_license": props.get("model_license", ""),
        "inputs": signature(model.graph.input, initialized),
        "outputs": signature(model.graph.output),
    }

