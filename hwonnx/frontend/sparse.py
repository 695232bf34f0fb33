"""Densify sparse tensors: sparse initializers become initializers and ``Constant`` nodes with
``sparse_value`` get a dense ``value``, so that the rest of the frontend sees dense tensors."""

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import ModelError, ResourceError
from .common import MAX_TENSOR_ELEMENTS, ReadLog, dims_size, elem_type_name, subgraphs

__all__ = ["densify_sparse", "MAX_DENSIFIED_ELEMENTS"]

#: The dense tensors made from the sparse ones of a model may have at most this many elements
#: together: a sparse tensor stores a few values of a possibly huge tensor.
MAX_DENSIFIED_ELEMENTS = MAX_TENSOR_ELEMENTS


def densify_sparse(model: onnx.ModelProto, rlog: ReadLog) -> None:
    """Replace every sparse initializer and ``Constant`` ``sparse_value`` by its dense tensor,
    in place, with a note for each.

    Raises
    ------
    ModelError
        If a sparse tensor's values, indices and dims do not fit together; names the tensor.
    ResourceError
        If the dense tensors together would exceed :data:`MAX_DENSIFIED_ELEMENTS`.
    """
    made = [0]
    for graph in subgraphs(model.graph):
        for sparse in graph.sparse_initializer:
            name = sparse.values.name
            dense = _densify(sparse, f"Sparse initializer '{name}'", made)
            graph.initializer.append(numpy_helper.from_array(dense, name))
            stored = int(sparse.values.dims[0]) if sparse.values.dims else 0
            rlog.note(f"Densified sparse initializer '{name}' ({stored} of {dense.size} values "
                      f"stored)")
        del graph.sparse_initializer[:]
        for node in graph.node:
            if node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
                continue
            for index, attr in enumerate(node.attribute):
                if attr.name == "sparse_value" and attr.HasField("sparse_tensor"):
                    dense = _densify(attr.sparse_tensor, f"Constant '{node.name}' sparse_value",
                                     made)
                    node.attribute[index].CopyFrom(onnx.helper.make_attribute(
                        "value", numpy_helper.from_array(dense)))
                    rlog.note(f"Densified the sparse_value of Constant '{node.name}'")


def _densify(sparse: onnx.SparseTensorProto, what: str, made: "list[int]") -> np.ndarray:
    """Return the dense array of ``sparse``; ``made[0]`` counts the elements densified so
    far in the model."""
    dims = [int(d) for d in sparse.dims]
    if any(d < 0 for d in dims) or dims_size(dims) > MAX_TENSOR_ELEMENTS:
        raise ModelError(f"{what} has dims {dims}; they must be non-negative and hold at most "
                         f"{MAX_TENSOR_ELEMENTS} elements")
    if made[0] + dims_size(dims) > MAX_DENSIFIED_ELEMENTS:
        raise ResourceError(f"{what} has dims {dims}, {dims_size(dims)} elements, and the "
                            f"sparse tensors densified before it hold {made[0]}; hwonnx makes "
                            f"at most {MAX_DENSIFIED_ELEMENTS} elements of dense tensors from "
                            f"sparse ones per model")
    made[0] += dims_size(dims)
    values, indices = sparse.values, sparse.indices
    if len(values.dims) != 1:
        raise ModelError(f"{what} must store its values as a 1-D tensor [NNZ], not "
                         f"{list(values.dims)}")
    nnz = int(values.dims[0])
    if indices.data_type != onnx.TensorProto.INT64 or \
            list(indices.dims) not in ([nnz], [nnz, len(dims)]):
        raise ModelError(f"{what} must have int64 indices of shape [{nnz}] or "
                         f"[{nnz}, {len(dims)}], not {elem_type_name(indices.data_type)} "
                         f"{list(indices.dims)}")
    try:
        flat_values = numpy_helper.to_array(values).reshape(-1)
        index = numpy_helper.to_array(indices).astype(np.int64)
    except (ValueError, TypeError) as error:
        raise ModelError(f"{what} cannot be read: {error}") from error
    size = dims_size(dims)
    if index.ndim == 2:
        if np.any(index < 0) or np.any(index >= np.array(dims, np.int64)):
            raise ModelError(f"{what} has an index outside its dims {dims}")
        index = np.ravel_multi_index(tuple(index.T), dims) if nnz else index.reshape(-1)
    if np.any(index < 0) or np.any(index >= size):
        raise ModelError(f"{what} has an index outside its {size} elements")
    dense = np.zeros(size, dtype=flat_values.dtype)
    dense[index] = flat_values
    return dense.reshape(dims)
