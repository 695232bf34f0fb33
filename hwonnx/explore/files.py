"""Files written whole or not at all: into a temporary file beside the target, then renamed
over it, so that an interrupted sweep never leaves half a result."""

import contextlib
import json
import os
import tempfile
from pathlib import Path

__all__ = ["write_atomic", "write_json", "read_json"]


def write_atomic(path: Path, data: "bytes | str") -> None:
    path = Path(path)
    handle, partial = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data.encode() if isinstance(data, str) else data)
        mask = os.umask(0o022)
        os.umask(mask)
        os.chmod(partial, 0o666 & ~mask)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise


def write_json(path: Path, value) -> None:
    write_atomic(path, json.dumps(value, indent=1, sort_keys=False) + "\n")


def read_json(path: Path) -> "dict | None":
    """The JSON object in ``path``, or None when it is missing or not a JSON object."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
