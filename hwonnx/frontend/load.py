"""The frontend entry point: read, validate, check support, bind, infer, fold, convert."""

import os
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from ..errors import ModelError
from ..ir.graph import Graph
from ..passes.pipeline import FLOAT_PIPELINE, PassContext, run_pipeline
from .convert import convert_graph
from .fold import fold_constants, remove_dead_nodes
from .shapes import apply_overrides, bind_input_shapes, infer_shapes, value_types
from .support import check_support
from .validate import name_nodes, validate_model

__all__ = ["load_model", "read_model"]


def read_model(source: "str | os.PathLike | bytes | onnx.ModelProto") -> onnx.ModelProto:
    """Return a private copy of the model at ``source`` (a path, serialized bytes or a
    ``ModelProto``).

    Raises
    ------
    ModelError
        If the file is missing, unreadable or not an ONNX protobuf.
    """
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)
        return model
    label = "<bytes>" if isinstance(source, bytes) else os.fspath(source)
    try:
        if isinstance(source, bytes):
            return onnx.load_model_from_string(source)
        return onnx.load(os.fspath(source))
    except OSError as error:
        raise ModelError(f"Cannot read model '{label}': {error.strerror or error}") from error
    except (DecodeError, ValueError, onnx.checker.ValidationError) as error:
        text = " ".join(str(error).split())
        raise ModelError(f"Cannot read model '{label}': it is not an ONNX model ({text})"
                         ) from error


def load_model(path_or_model: "str | Path | bytes | onnx.ModelProto",
               input_shapes: "dict[str, tuple[int, ...]] | None" = None,
               override_initializers: "dict[str, np.ndarray] | None" = None,
               *, pass_context: "PassContext | None" = None) -> Graph:
    """Import an ONNX model as a verified float IR graph.

    The model is read, validated against the ONNX IR rules, checked for support (before any
    other processing, so that every unsupported node is reported at once), its symbolic
    dimensions are bound, shapes are inferred, constant subgraphs are folded, and the result
    is converted to the float vocabulary of :mod:`hwonnx.ir.graph` and run through
    :data:`hwonnx.passes.FLOAT_PIPELINE`.

    Parameters
    ----------
    path_or_model : str, Path, bytes or onnx.ModelProto
        The model file, its bytes or the model itself (which is not modified).
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
        The float graph; its graph inputs and outputs keep their ONNX names.

    Raises
    ------
    ModelError
        If the model cannot be read, breaks an ONNX IR rule, has unbound or contradictory
        dimensions, or uses a supported operator in a form hwonnx cannot map.
    UnsupportedOperatorError
        If any node uses an unsupported operator; lists all of them.
    """
    model = read_model(path_or_model)
    name_nodes(model)
    validate_model(model)
    check_support(model)
    bind_input_shapes(model, input_shapes)
    apply_overrides(model, override_initializers)
    ir_version = model.ir_version
    model.ir_version = max(ir_version, 4)   # before IR 4, initializers had to be inputs too
    model = infer_shapes(model)
    model.ir_version = ir_version
    types = value_types(model)
    nodes, constants = fold_constants(model, types)
    nodes = remove_dead_nodes(nodes, {value.name for value in model.graph.output})
    graph = convert_graph(model, nodes, constants, types)
    return run_pipeline(graph, FLOAT_PIPELINE, pass_context or PassContext())
