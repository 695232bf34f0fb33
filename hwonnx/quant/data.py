"""Reading sample batches (calibration data, simulation inputs) from .npz/.npy files."""

from pathlib import Path

import numpy as np

from ..errors import QuantizationError
from ..ir import Graph

__all__ = ["load_samples", "normalize_samples"]


def normalize_samples(graph: Graph, arrays: "dict[str, np.ndarray]", what: str
                      ) -> "dict[str, np.ndarray]":
    """Check a batch against the graph inputs and return ``name -> [S, *input_shape]``.

    The first axis indexes samples; each sample has the input's shape, and a leading batch
    axis of 1 may be omitted.
    """
    missing = [name for name in graph.inputs if name not in arrays]
    if missing:
        raise QuantizationError(f"{what} has no array for graph input(s) "
                                f"{', '.join(repr(n) for n in missing)}; it has "
                                f"{', '.join(repr(n) for n in arrays) or 'none'}")
    result, count = {}, None
    for name in graph.inputs:
        shape = graph.types[name].shape
        array = np.asarray(arrays[name])
        if array.ndim == len(shape) and shape[0] == 1 and array.shape[1:] == shape[1:]:
            array = array.reshape((array.shape[0],) + shape)
        elif array.ndim == len(shape) + 1 and array.shape[1:] == shape:
            pass
        else:
            raise QuantizationError(
                f"{what}: array '{name}' has shape {array.shape}, but samples of input "
                f"'{name}' {shape} need shape (S, {', '.join(map(str, shape))}) or "
                f"(S, {', '.join(map(str, shape[1:]))})")
        if not np.issubdtype(array.dtype, np.number):
            raise QuantizationError(f"{what}: array '{name}' has dtype {array.dtype}, not a "
                                    f"number type")
        if count is not None and array.shape[0] != count:
            raise QuantizationError(f"{what}: inputs have different sample counts "
                                    f"({count} and {array.shape[0]})")
        count = array.shape[0]
        if count == 0:
            raise QuantizationError(f"{what}: array '{name}' holds no samples")
        dtype = np.dtype(graph.types[name].dtype)
        if dtype.kind in "iu":                  # an integer input (read by a host Cast)
            info = np.iinfo(dtype)
            bad = (array != np.round(array)) | (array < info.min) | (array > info.max)
            if bad.any():
                raise QuantizationError(
                    f"{what}: array '{name}' holds {float(array[bad].reshape(-1)[0]):g}, which "
                    f"is not a {dtype} value (input '{name}' is {dtype})")
        result[name] = array.astype(np.float32)
    return result


def load_samples(path: "str | Path", graph: Graph, what: str = "Sample file"
                 ) -> "dict[str, np.ndarray]":
    """Load ``path``: an ``.npz`` with one array per graph input (named after it), an
    ``.npy`` for a single-input model, or a folder holding ``<input>.npy`` for every input
    (other files are ignored) or, for a single-input model, one ``.npy`` per sample."""
    path = Path(path)
    if not path.exists():
        raise QuantizationError(f"{what} '{path}' does not exist")
    try:
        if path.is_dir():
            files = sorted(path.glob("*.npy"))
            if not files:
                raise QuantizationError(f"{what} folder '{path}' holds no .npy files")
            by_name = {f.stem: f for f in files}
            if all(name in by_name for name in graph.inputs):
                arrays = {name: np.load(by_name[name]) for name in graph.inputs}
            elif len(graph.inputs) == 1:      # one sample per file, in file-name order
                arrays = {graph.inputs[0]: np.stack([np.load(f) for f in files])}
            else:
                arrays = {f.stem: np.load(f) for f in files}
        elif path.suffix == ".npz":
            with np.load(path) as npz:
                arrays = {key: npz[key] for key in npz.files}
        elif path.suffix == ".npy":
            if len(graph.inputs) != 1:
                raise QuantizationError(
                    f"{what} '{path}' is a single .npy, but the model has "
                    f"{len(graph.inputs)} inputs; use an .npz keyed by input name")
            arrays = {graph.inputs[0]: np.load(path)}
        else:
            raise QuantizationError(f"{what} '{path}' must be an .npz, an .npy or a folder "
                                    f"of .npy files")
    except (OSError, ValueError) as error:
        raise QuantizationError(f"Cannot read {what.lower()} '{path}': {error}") from error
    return normalize_samples(graph, arrays, f"{what} '{path}'")
