"""Read a model: the protobuf itself, then its external tensor data (with hwonnx's own path and
size checks, never onnx's loader), then every stored tensor is checked before any of it is
turned into an array."""

import hashlib
import os
import re
import stat
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from ..errors import ModelError
from .common import (
    MAX_RANK,
    MAX_TENSOR_BYTES,
    MAX_TENSOR_ELEMENTS,
    READ_TYPES,
    all_tensors,
    count_text,
    dims_size,
    dims_text,
    elem_type_name,
)

__all__ = ["read_model", "MAX_MODEL_BYTES"]

#: protobuf cannot parse a message of 2 GiB or more.
MAX_MODEL_BYTES = (1 << 31) - 1
#: A model file larger than this is copied once more after parsing, so that the memory of any
#: unknown fields dropped is given back (finding out whether there were any costs as much).
_RECOPY_BYTES = 1 << 26
_CHUNK = 1 << 20
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))
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

    External data is read only from regular files inside the model's folder (``location``
    relative, no ``..``, no symbolic link leading out), at the given offset and length, after
    its size has been checked against the tensor's dims. Fields onnx does not know are
    dropped. The model file is read with a bound (:data:`MAX_MODEL_BYTES`), whatever size the
    file system reports.

    Raises
    ------
    ModelError
        If the file is missing, unreadable, not a regular file, empty, too large or not an ONNX
        protobuf, or if external data is unsafe, missing or short (the message names the
        tensor).
    """
    base: "Path | None" = None
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)
        model.DiscardUnknownFields()
    else:
        label = "<bytes>" if isinstance(source, (bytes, bytearray)) else os.fspath(source)
        try:
            if isinstance(source, (bytes, bytearray)):
                data = source
            else:
                base = Path(os.path.abspath(label)).parent
                data = _read_file(label)
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
        size = len(data)
        del data
        model = _without_unknown_fields(model, size)
    _check_text(model, "model")
    digests: "dict[Path, str]" = {}                  # SHA1 of each external file, once
    for where, tensor in all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            _load_external(tensor, where, base, digests)
        check_tensor(tensor, where)
    return model


def _open_regular(path: "str | Path", what: str) -> int:
    """Open ``path`` for reading and return the descriptor, refusing anything but a regular
    file (a FIFO or a device would block or never end; opened without blocking to find out).
    ``what`` starts the message."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(mode)), None)
        raise ModelError(f"{what}: it is {kind}, not a regular file" if kind else
                         f"{what}: it is not a regular file")
    os.set_blocking(fd, True)
    return fd


def _read_file(label: str) -> bytearray:
    """Read the model file ``label``, refusing it as soon as it proves larger than
    :data:`MAX_MODEL_BYTES` (its size on disk is only a hint: files under ``/proc`` say 0)."""
    too_large = (f"Cannot read model '{label}': it is larger than {MAX_MODEL_BYTES} bytes, and a "
                 f"protobuf file must be smaller than 2 GiB; store large tensors as external "
                 f"data")
    fd = _open_regular(label, f"Cannot read model '{label}'")
    try:
        size = os.fstat(fd).st_size
        if size > MAX_MODEL_BYTES:
            raise ModelError(f"Cannot read model '{label}': it is {size} bytes, and a protobuf "
                             f"file must be smaller than 2 GiB; store large tensors as external "
                             f"data")
        data = bytearray(size)
        with open(fd, "rb", buffering=0, closefd=False) as stream:
            view, done = memoryview(data), 0
            while done < size:
                count = stream.readinto(view[done:])
                if not count:
                    break
                done += count
            view.release()
            del data[done:]
            while chunk := stream.read(_CHUNK):   # the file may be longer than it said
                data += chunk
                if len(data) > MAX_MODEL_BYTES:
                    raise ModelError(too_large)
        return data
    finally:
        os.close(fd)


def _without_unknown_fields(model: onnx.ModelProto, size: int) -> onnx.ModelProto:
    """Drop the fields onnx does not know (hwonnx cannot use them). The memory of a parsed
    message is given back only with the whole message, so a large model is copied."""
    model.DiscardUnknownFields()
    if size <= _RECOPY_BYTES:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _check_text(message, path: str) -> None:
    """Check that every string field of ``message`` (recursively) is valid UTF-8; protobuf
    hands invalid ones over as bytes, which nothing downstream expects. Bytes fields (tensor
    data) are never read: reading one copies it."""
    stack = [(message, path)]
    while stack:
        current, where = stack.pop()
        for field, value in _text_fields(current):
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


def _text_fields(message):
    """Yield ``(field, value)`` for the string and message fields set in ``message``."""
    descriptor = message.DESCRIPTOR
    if not any(f.type == f.TYPE_BYTES for f in descriptor.fields):
        yield from message.ListFields()
        return
    for field in descriptor.fields:
        if field.type not in (field.TYPE_STRING, field.TYPE_MESSAGE):
            continue
        if field.is_repeated:
            value = getattr(message, field.name)
            if len(value):
                yield field, value
        elif message.HasField(field.name):
            yield field, getattr(message, field.name)


def check_tensor(tensor: onnx.TensorProto, where: str) -> None:
    """Check that a stored tensor has a readable element type, sane dims and exactly the
    number of values its dims need, in one value field, before anything makes an array of
    it."""
    what = where[0].upper() + where[1:]
    count = _check_header(tensor, what)
    used = [f for f in ("raw_data", *_VALUE_FIELDS)
            if (tensor.HasField(f) if f == "raw_data" else len(getattr(tensor, f)))]
    if len(used) > 1:
        raise ModelError(f"{what} stores values in both {used[0]} and {used[1]} (ONNX IR: a "
                         f"tensor stores its values in exactly one field)")
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
        raise ModelError(f"{what} has {stored} {unit}, but its dims {dims_text(tensor.dims)} "
                         f"need {need}")


def _check_header(tensor: onnx.TensorProto, what: str) -> int:
    """Check element type, dims and size; return the number of elements."""
    if tensor.data_type not in READ_TYPES:
        raise ModelError(f"{what} has {elem_type_name(tensor.data_type)}; hwonnx reads only "
                         f"float, integer and bool tensors")
    if any(d < 0 for d in tensor.dims):
        raise ModelError(f"{what} has negative dims {dims_text(tensor.dims)}")
    count = dims_size(tensor.dims)
    if count > MAX_TENSOR_ELEMENTS or count * READ_TYPES[tensor.data_type] > MAX_TENSOR_BYTES:
        raise ModelError(f"{what} has {count_text(count)} elements (dims "
                         f"{dims_text(tensor.dims)}), more than hwonnx's limit of "
                         f"{MAX_TENSOR_ELEMENTS} elements or {MAX_TENSOR_BYTES} bytes")
    if dims_size(d for d in tensor.dims if d) > MAX_TENSOR_ELEMENTS:   # numpy refuses them
        raise ModelError(f"{what} has no elements, but dims {dims_text(tensor.dims)} whose "
                         f"non-zero dims hold more than hwonnx's limit of "
                         f"{MAX_TENSOR_ELEMENTS} elements")
    if len(tensor.dims) > MAX_RANK:                                       # numpy's limit
        raise ModelError(f"{what} has rank {len(tensor.dims)}, more than hwonnx's limit of "
                         f"{MAX_RANK} axes")
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
                         f"{dims_text(tensor.dims)} need {need} bytes")
    try:
        fd = _open_regular(path, f"{what} cannot read its external data file '{location}'")
        with open(fd, "rb") as stream:
            size = os.fstat(fd).st_size
            if offset + need > size:
                raise ModelError(f"{what} needs bytes {offset} to {offset + need} of external "
                                 f"data file '{location}', which has only {size} bytes")
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
    with open(_open_regular(path, f"Cannot read '{path}'"), "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
