"""The quantizer's shared parameter helpers: an activation's int8 scale and zero point, a
requantization's ``mult``/``shift``, a fused activation's clamp bounds, and the integer
graph's new constants. A leaf of :mod:`hwonnx.quant`: the quantizers of every operator
(:mod:`.ptq`, :mod:`.eltwise`, :mod:`.residual`, :mod:`.copies`) build on it."""

import math

import numpy as np

from ..errors import QuantizationError
from ..ir import Node, TensorType
from .channels import expressible, mult_shift

__all__ = ["activation_params", "requant_params", "clamp_bounds", "add_constants"]


def activation_params(lo: float, hi: float, value: str = "a value"
                      ) -> "tuple[float, int]":
    """Asymmetric int8 scale and zero point covering ``[min(lo, 0), max(hi, 0)]``; a range
    that is not finite (of ``value``, for the message) is a :class:`QuantizationError`."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise QuantizationError(f"The calibration range of {value} is [{lo:g}, {hi:g}]; an "
                                f"int8 scale needs finite values")
    if hi - lo < 1e-12:
        return 1.0, 0
    scale = (hi - lo) / 255.0
    zero_point = int(np.clip(round(-128 - lo / scale), -128, 127))
    return scale, zero_point


def requant_params(real: np.ndarray, layer: str) -> "tuple[np.ndarray, np.ndarray]":
    """Express each positive real multiplier as ``mult * 2**-shift`` with ``mult`` in
    ``[2**30, 2**31)`` and ``shift`` in ``[1, 63]``."""
    mult = np.zeros(real.shape, dtype=np.int64)
    shift = np.ones(real.shape, dtype=np.int64)
    for i, value in enumerate(real):
        if value == 0:
            continue
        if not math.isfinite(value):
            raise QuantizationError(f"Layer '{layer}': requantization scale {value:.3g} of "
                                    f"channel {i} is not a finite number")
        m, s = mult_shift(value)
        if not expressible(value):
            raise QuantizationError(f"Layer '{layer}': requantization scale {value:.3g} of "
                                    f"channel {i} is outside what a 31-bit multiplier and "
                                    f"a shift of 1..63 can express")
        mult[i], shift[i] = m, s
    return mult.astype(np.int32), shift.astype(np.int32)


def clamp_bounds(node: Node, out_params) -> "tuple[int, int]":
    """int8 clamp bounds of a fused ReLU (real 0) and Clip maximum."""
    scale, zp = out_params
    lo = max(-128, zp) if node.attrs.get("relu") else -128
    hi = 127
    if node.attrs.get("act_max") is not None:
        hi = int(np.clip(round(float(node.attrs["act_max"]) / scale) + zp, lo, 127))
    return lo, hi


def add_constants(prefix: str, arrays: dict, constants: dict, types: dict
                  ) -> "tuple[str, ...]":
    """Add each of ``arrays`` (key -> array) to the integer graph's ``constants`` and
    ``types`` as ``<prefix>:<key>``; returns the names, in order."""
    names = []
    for key, array in arrays.items():
        name = f"{prefix}:{key}"
        constants[name] = array
        types[name] = TensorType(str(array.dtype), array.shape)
        names.append(name)
    return tuple(names)
