"""Densify sparse tensors: sparse initializers become initializers and ``Constant`` nodes with
``sparse_value`` get a dense ``value``, so that the rest of the frontend sees dense tensors."""

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import ModelError
from .common import MAX_TENSOR_ELEMENTS, ReadLog, dims_size, elem_type_name, subgraphs

__all__ = ["densify_sparse"]


def densify_sparse(model: onnx.ModelProto, rlog: ReadLog) -> None:
    """Replace every sparse initializer and ``Constant`` ``sparse_value`` by its dense tensor,
    in place, with a note for each.

    Raises
    ------
    ModelError
        If a sparse tensor's values, indices and dims do not fit together; names the tensor.
    """
    for graph in subgraphs(model.graph):
        for sparse in graph.sparse_initializer:
            name = sparse.values.name
            dense = _densify(sparse, f"Sparse initializer '{name}'")
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
                    dense = _densify(attr.sparse_tensor, f"Constant '{node.name}' sparse_value")
                    node.attribute[index].CopyFrom(onnx.helper.make_attribute(
                        "value", numpy_helper.from_array(dense)))
                    rlog.note(f"Densified the sparse_value of Constant '{node.name}'")


def _densify(sparse: onnx.SparseTensorProto, what: str) -> np.ndarray:
    dims = [int(d) for d in sparse.dims]
    if any(d < 0 for d in dims) or dims_size(dims) > MAX_TENSOR_ELEMENTS:
        raise ModelError(f"{what} has dims {dims}; they must be non-negative and hold at most "
                         f"{MAX_TENSOR_ELEMENTS} elements")
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
