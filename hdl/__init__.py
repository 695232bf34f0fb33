"""Amaranth HDL of the accelerator (installed as ``hwonnx.hdl``)."""

from .array import SystolicArray, array_latency
from .top import Accelerator

__all__ = ["Accelerator", "SystolicArray", "array_latency"]
