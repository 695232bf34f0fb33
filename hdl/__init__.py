"""Amaranth HDL of the accelerator (installed as ``hwonnx.hdl``)."""

import hashlib
from pathlib import Path

from .. import isa
from .array import SystolicArray, array_latency
from .top import Accelerator

__all__ = ["Accelerator", "SystolicArray", "array_latency", "SOURCE_DIGEST"]

#: SHA-256 of the HDL and ISA sources as this process imported them (read right after the
#: import, not when a build is keyed: a source edited later, while a process still runs the
#: code it imported before, must not give that code's Verilog the edited source's cache key).
SOURCE_DIGEST = hashlib.sha256(b"".join(
    path.read_bytes() for path in sorted(Path(__file__).parent.glob("*.py")) + [
        Path(isa.__file__)])).hexdigest()
