"""Read a model: the protobuf itself, then its external tensor data (with hwonnx's own path and
size checks, never onnx's loader), then every stored tensor is checked before any of it is
turned into an array."""

import hashlib
import os
import re
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from ..errors import ModelError
from .common import (
    MAX_TENSOR_BYTES,
    MAX_TENSOR_ELEMENTS,
    READ_TYPES,
    all_tensors,
    dims_size,
    elem_type_name,
)

__all__ = ["read_model", "MAX_MODEL_BYTES"]

#: protobuf cannot parse a message of 2 GiB or more.
MAX_MODEL_BYTES = (1 << 31) - 1
_EXTERNAL_KEYS = ("location", "offset", "length", "checksum")
# TensorProto field that holds the values of each element type when raw_data is not used.
_VALUE_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data",
                 "uint64_data")
_FIELD_OF = {
    onnx.TensorProto.FLOAT: "float_data", onnx.TensorProto.DOUBLE: "double_data",
    onnx.TensorProto.INT64: "int64_data", onnx.TensorProto.UINT32: "uint64_data",
    onnx.TensorProto.UINT64: "uint64_data",
}


def read_model(source: "str | os.PathLike | bytes | onnx.ModelProto") -> onnx.ModelProto:
    """Return a private copy of the model at ``source`` (a path, serialized bytes or a
    ``ModelProto``), with its external tensor data read in.

    External data is read only from files inside the model's folder (``location`` relative,
    no ``..``, no symbolic link leading out), at the given offset and length, after its size
    has been checked against the tensor's dims.

    Raises
    ------
    ModelError
        If the file is missing, unreadable, empty, too large or not an ONNX protobuf, or if
        external data is unsafe, missing or short (the message names the tensor).
    """
    base: "Path | None" = None
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)
    else:
        label = "<bytes>" if isinstance(source, (bytes, bytearray)) else os.fspath(source)
        try:
            if isinstance(source, (bytes, bytearray)):
                data = bytes(source)
            else:
                base = Path(os.path.abspath(label)).parent
                size = os.stat(label).st_size
                if size > MAX_MODEL_BYTES:
                    raise ModelError(f"Cannot read model '{label}': it is {size} bytes, and a "
                                     f"protobuf file must be smaller than 2 GiB; store large "
                                     f"tensors as external data")
                with open(label, "rb") as stream:
                    data = stream.read()
            if not data:        # parses as a model that sets nothing: say what is wrong
                raise ModelError(f"Model file '{label}' is empty" if base else
                                 "The model bytes are empty")
            model = onnx.ModelProto()
            model.ParseFromString(data)
        except OSError as error:
            raise ModelError(f"Cannot read model '{label}': {error.strerror or error}"
                             ) from error
        except (DecodeError, ValueError, RuntimeError) as error:
            text = " ".join(str(error).split())
            raise ModelError(f"Cannot read model '{label}': it is not an ONNX model ({text})"
                             ) from error
    _check_text(model, "model")
    digests: "dict[Path, str]" = {}                  # SHA1 of each external file, once
    for where, tensor in all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            _load_external(tensor, where, base, digests)
        check_tensor(tensor, where)
    return model


def _check_text(message, path: str) -> None:
    """Check that every string field of ``message`` (recursively) is valid UTF-8; protobuf
    hands invalid ones over as bytes, which nothing downstream expects."""
    stack = [(message, path)]
    while stack:
        current, where = stack.pop()
        for field, value in current.ListFields():
            if field.type == field.TYPE_STRING:
                values = value if field.is_repeated else [value]
                if any(not isinstance(v, str) for v in values):
                    raise ModelError(f"Cannot read the model: field {where}.{field.name} is not "
                                     f"valid UTF-8 text (ONNX strings are UTF-8)")
            elif field.type == field.TYPE_MESSAGE:
                if field.message_type.GetOptions().map_entry:
                    continue
                items = value if field.is_repeated else [value]
                stack.extend((item, f"{where}.{field.name}") for item in items)


def check_tensor(tensor: onnx.TensorProto, where: str) -> None:
    """Check that a stored tensor has a readable element type, sane dims and exactly the
    number of values its dims need, before anything makes an array of it."""
    what = where[0].upper() + where[1:]
    count = _check_header(tensor, what)
    if tensor.HasField("raw_data"):
        stored, need = len(tensor.raw_data), count * READ_TYPES[tensor.data_type]
        unit = "bytes of raw_data"
    else:
        field = _FIELD_OF.get(tensor.data_type, "int32_data")
        stored, need, unit = len(getattr(tensor, field)), count, f"values in {field}"
        if tensor.data_type in (onnx.TensorProto.UINT32, onnx.TensorProto.UINT64) and \
                not stored and tensor.int64_data:
            stored, unit = len(tensor.int64_data), "values in int64_data"
    if stored != need:
        raise ModelError(f"{what} has {stored} {unit}, but its dims {list(tensor.dims)} need "
                         f"{need}")


def _check_header(tensor: onnx.TensorProto, what: str) -> int:
    """Check element type, dims and size; return the number of elements."""
    if tensor.data_type not in READ_TYPES:
        raise ModelError(f"{what} has {elem_type_name(tensor.data_type)}; hwonnx reads only "
                         f"float, integer and bool tensors")
    if any(d < 0 for d in tensor.dims):
        raise ModelError(f"{what} has negative dims {list(tensor.dims)}")
    count = dims_size(tensor.dims)
    if count > MAX_TENSOR_ELEMENTS or count * READ_TYPES[tensor.data_type] > MAX_TENSOR_BYTES:
        raise ModelError(f"{what} has {count} elements (dims {list(tensor.dims)}), more than "
                         f"hwonnx's limit of {MAX_TENSOR_ELEMENTS} elements or "
                         f"{MAX_TENSOR_BYTES} bytes")
    if tensor.HasField("segment"):
        raise ModelError(f"{what} is a segment of a tensor; hwonnx does not read segments")
    return count


def _load_external(tensor: onnx.TensorProto, where: str, base: "Path | None",
                   digests: "dict[Path, str]") -> None:
    what = where[0].upper() + where[1:]
    rule = "(ONNX IR: external data MUST give a file name relative to the model file)"
    used = [f for f in ("raw_data", *_VALUE_FIELDS)
            if (tensor.HasField(f) if f == "raw_data" else len(getattr(tensor, f)))]
    if used:
        raise ModelError(f"{what} stores its data externally and must not also use the value "
                         f"fields, but sets {used[0]} (ONNX IR: external tensors MUST NOT use "
                         f"the value fields)")
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location", "")
    if not location:
        raise ModelError(f"{what} stores its data externally but gives no location {rule}")
    if base is None:
        raise ModelError(f"{what} stores its data in '{location}', relative to the model file, "
                         f"but the model was not read from a file; load it from its path")
    if "\0" in location:
        raise ModelError(f"{what} has external data location {location!r}, which contains a "
                         f"NUL character {rule}")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or \
            re.match(r"[A-Za-z]:", location):
        raise ModelError(f"{what} has external data location '{location}', which is absolute "
                         f"{rule}")
    parts = Path(location.replace("\\", "/")).parts
    if ".." in parts:
        raise ModelError(f"{what} has external data location '{location}', which leaves the "
                         f"model's folder {rule}")
    root = Path(os.path.realpath(base))
    path = Path(os.path.realpath(base / location))
    if path != root and root not in path.parents:
        raise ModelError(f"{what} has external data location '{location}', which leads out of "
                         f"the model's folder through a symbolic link {rule}")
    offset = _external_int(info, "offset", what)
    length = _external_int(info, "length", what)
    need = _check_header(tensor, what) * READ_TYPES[tensor.data_type]
    if length is not None and length != need:
        raise ModelError(f"{what} has external data length {length}, but its dims "
                         f"{list(tensor.dims)} need {need} bytes")
    try:
        size = os.stat(path).st_size
        if not path.is_file():
            raise IsADirectoryError(21, "Is a directory")
        if offset + need > size:
            raise ModelError(f"{what} needs bytes {offset} to {offset + need} of external data "
                             f"file '{location}', which has only {size} bytes")
        with open(path, "rb") as stream:
            stream.seek(offset)
            data = stream.read(need)
        checksum = info.get("checksum")
        if checksum:
            if path not in digests:
                digests[path] = _sha1(path)
            if digests[path] != checksum.lower():
                raise ModelError(f"{what} has external data file '{location}' with SHA1 "
                                 f"{digests[path]}, but the model gives checksum {checksum}")
    except OSError as error:
        raise ModelError(f"{what} cannot read its external data file '{location}': "
                         f"{error.strerror or error}") from error
    if len(data) != need:
        raise ModelError(f"{what} read {len(data)} of {need} bytes from external data file "
                         f"'{location}'")
    tensor.raw_data = data
    tensor.data_location = onnx.TensorProto.DEFAULT
    del tensor.external_data[:]


def _external_int(info: "dict[str, str]", key: str, what: str) -> "int | None":
    if key not in info:
        return 0 if key == "offset" else None
    text = info[key]
    if not text.isdigit() or len(text) > 18:
        raise ModelError(f"{what} has external data {key} '{text}'; it must be a non-negative "
                         f"integer")
    return int(text)


def _sha1(path: Path) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
