"""Reading sample batches (calibration data, simulation inputs) from .npz/.npy files."""

import zipfile
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

from ..errors import QuantizationError
from ..ir import Graph

__all__ = ["load_samples", "normalize_samples", "MAX_SAMPLE_VALUES", "MAX_SAMPLE_BYTES"]

#: The most values a sample file may hold, all arrays together (1 GiB as float32, which they
#: become), and the most bytes their data may take as stored (whatever the file's size: an
#: .npz member is compressed). Array headers are read first, so a file is refused before
#: anything is allocated for it.
MAX_SAMPLE_VALUES = 1 << 28
MAX_SAMPLE_BYTES = 1 << 30


def normalize_samples(graph: Graph, arrays: "dict[str, np.ndarray]", what: str
                      ) -> "dict[str, np.ndarray]":
    """Check a batch against the graph inputs and return ``name -> [S, *input_shape]``.

    The first axis indexes samples; each sample has the input's shape, and a leading batch
    axis of 1 may be omitted. For a model exported with a fixed batch N (rebound to 1 by the
    frontend, ``graph.meta["batches"]``), samples may also come in the model's own shape,
    ``(S, N, ...)``: their batches are split, ``S * N`` samples in order.
    """
    batches = dict(graph.meta.get("batches", {}))
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
        elif name in batches and array.ndim == len(shape) + 1 \
                and array.shape[1:] == (batches[name],) + tuple(shape[1:]):
            array = array.reshape((-1,) + tuple(shape))        # the model's batches, split
        else:
            batched = (f" or (S, {batches[name]}, {', '.join(map(str, shape[1:]))}) (the "
                       f"model's batch of {batches[name]})" if name in batches else "")
            raise QuantizationError(
                f"{what}: array '{name}' has shape {array.shape}, but samples of input "
                f"'{name}' {shape} need shape (S, {', '.join(map(str, shape))}) or "
                f"(S, {', '.join(map(str, shape[1:]))}){batched}")
        if not np.issubdtype(array.dtype, np.number):
            raise QuantizationError(f"{what}: array '{name}' has dtype {array.dtype}, not a "
                                    f"number type")
        if np.iscomplexobj(array):        # astype(float32) would drop the imaginary part
            raise QuantizationError(f"{what}: array '{name}' is complex ({array.dtype}); "
                                    f"hwonnx's inputs are real")
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
    budget = [MAX_SAMPLE_VALUES, MAX_SAMPLE_BYTES]         # what the arrays may still take
    try:
        if path.is_dir():
            files = sorted(path.glob("*.npy"))
            if not files:
                raise QuantizationError(f"{what} folder '{path}' holds no .npy files")
            by_name = {f.stem: f for f in files}
            if all(name in by_name for name in graph.inputs):
                arrays = {name: _load_npy(by_name[name], what, budget)
                          for name in graph.inputs}
            elif len(graph.inputs) == 1:      # one sample per file, in file-name order
                arrays = {graph.inputs[0]: _stack([_load_npy(f, what, budget) for f in files],
                                                  what, path)}
            else:
                arrays = {f.stem: _load_npy(f, what, budget) for f in files}
        elif path.suffix == ".npz":
            arrays = _load_npz(path, what, budget)
        elif path.suffix == ".npy":
            if len(graph.inputs) != 1:
                raise QuantizationError(
                    f"{what} '{path}' is a single .npy, but the model has "
                    f"{len(graph.inputs)} inputs; use an .npz keyed by input name")
            arrays = {graph.inputs[0]: _load_npy(path, what, budget)}
        else:
            raise QuantizationError(f"{what} '{path}' must be an .npz, an .npy or a folder "
                                    f"of .npy files")
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise QuantizationError(f"Cannot read {what.lower()} '{path}': {error}") from error
    return normalize_samples(graph, arrays, f"{what} '{path}'")


def _read_array(stream, available: int, label: str, what: str, budget: "list[int]"
                ) -> np.ndarray:
    """The array of an .npy ``stream`` of ``available`` bytes, its header checked before any
    data is read: no Python objects, at most ``budget[0]`` values and ``budget[1]`` bytes
    (then taken from the budget) and no more data than the file holds."""
    start = stream.tell() if stream.seekable() else 0
    version = npy_format.read_magic(stream)
    if version == (1, 0):
        shape, fortran, dtype = npy_format.read_array_header_1_0(stream)
    elif version == (2, 0):
        shape, fortran, dtype = npy_format.read_array_header_2_0(stream)
    else:
        raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")
    if dtype.hasobject:         # pickled Python objects: never loaded
        raise QuantizationError(f"{what} {label} holds an array of Python objects, not "
                                f"numbers")
    count = int(np.prod(shape, dtype=object))
    if count > budget[0]:
        raise QuantizationError(f"{what} {label} holds an array of shape {tuple(shape)}: more "
                                f"than the {MAX_SAMPLE_VALUES:,} values a sample file may "
                                f"hold")
    needed = count * dtype.itemsize
    if needed > budget[1]:
        raise QuantizationError(f"{what} {label} holds an array of shape {tuple(shape)} and "
                                f"dtype {dtype} ({needed:,} bytes): more than the "
                                f"{MAX_SAMPLE_BYTES:,} bytes a sample file may hold")
    header = (stream.tell() - start) if stream.seekable() else 0
    if needed > available - header:
        raise QuantizationError(f"{what} {label} claims an array of shape {tuple(shape)} "
                                f"({needed:,} bytes), but holds only "
                                f"{max(0, available - header):,} bytes of data")
    data = stream.read(needed)
    if len(data) != needed:
        raise QuantizationError(f"{what} {label} ends after {len(data):,} of its {needed:,} "
                                f"bytes of data")
    budget[0] -= count
    budget[1] -= needed
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")


def _load_npy(path: Path, what: str, budget: "list[int]") -> np.ndarray:
    with open(path, "rb") as stream:
        return _read_array(stream, path.stat().st_size, f"'{path}'", what, budget)


def _load_npz(path: Path, what: str, budget: "list[int]") -> "dict[str, np.ndarray]":
    """The arrays of an .npz (a zip of .npy members, as ``np.savez`` writes), each header
    checked before its data is read; members that are not ``.npy`` are ignored."""
    arrays = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                continue
            with archive.open(info) as stream:
                arrays[info.filename[:-4]] = _read_array(
                    stream, info.file_size, f"'{path}' (array '{info.filename[:-4]}')", what,
                    budget)
    if not arrays:
        raise QuantizationError(f"{what} '{path}' holds no arrays")
    return arrays


def _stack(arrays: "list[np.ndarray]", what: str, path: Path) -> np.ndarray:
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise QuantizationError(f"{what} folder '{path}' holds .npy files of different shapes "
                                f"({', '.join(str(s) for s in sorted(shapes))})")
    return np.stack(arrays)


def calibration_feeds(graph: Graph, calib: "dict[str, np.ndarray]") -> "dict[str, np.ndarray]":
    """The calibration samples of each input of ``graph``, ``[S, *shape[1:]]``; a
    :class:`QuantizationError` names an input whose samples are not all finite."""
    feeds = {name: np.asarray(calib[name]).reshape((-1,) + graph.types[name].shape[1:])
             for name in graph.inputs}
    for name, array in feeds.items():
        if not np.isfinite(array).all():
            raise QuantizationError(f"Calibration data for input '{name}' holds NaN or "
                                    f"infinite values")
    return feeds
