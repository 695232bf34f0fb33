"""Degenerate output channels of a Conv/Dense layer: weights that are all (nearly) zero, or
too small for the bias at the usual weight scale. Such a channel is no error: its weight scale
is raised until the requantization multiplier and the int32 accumulator can hold it, and a
channel whose weights then quantize to zero is a constant, its bias through an exact
requantizer (multiplier 1)."""

import logging
import math

import numpy as np

from ..errors import QuantizationError
from ..golden.ops import INT32_MAX, accumulate_bound

__all__ = ["MULT_BITS", "SHIFT_RANGE", "mult_shift", "expressible", "fit_channels",
           "check_accumulator"]

log = logging.getLogger(__name__)

#: The requantization multiplier ``mult * 2**-shift``: ``mult`` in ``[2**30, 2**31)`` (the
#: POST's 31-bit multiplier), ``shift`` in ``SHIFT_RANGE`` (its shifter).
MULT_BITS = 31
SHIFT_RANGE = (1, 63)
#: The smallest multiplier a raised weight scale gives (half an octave above the smallest
#: expressible, ``2**-33``), and the largest bias it leaves (half of int32 for the products).
_M_MIN = 2.0 ** -32
_BIAS_LIMIT = float(1 << 30)
#: A constant channel's bias (in output steps) beyond which the clamp gives the same int8.
_CONSTANT_LIMIT = float(1 << 16)


def mult_shift(value: float) -> "tuple[int, int]":
    """``value > 0`` as ``(mult, shift)`` with ``mult`` in ``[2**30, 2**31)``; the shift may
    lie outside :data:`SHIFT_RANGE` (see :func:`expressible`)."""
    fraction, exponent = math.frexp(float(value))
    m, s = round(fraction * (1 << MULT_BITS)), MULT_BITS - exponent
    if m == 1 << MULT_BITS:
        m, s = m // 2, s - 1
    return m, s


def expressible(value: float) -> bool:
    """Whether a finite real multiplier is 0 or ``mult * 2**-shift`` with the shift in range."""
    if value == 0:
        return True
    return SHIFT_RANGE[0] <= mult_shift(value)[1] <= SHIFT_RANGE[1]


def fit_channels(name: str, w: np.ndarray, b: np.ndarray, wq: np.ndarray, bq: np.ndarray,
                 real: np.ndarray, s_in: float, s_out: float, in_zp: int, given: bool,
                 warnings: "list[str]") -> None:
    """Make every output channel of layer ``name`` fit the hardware, in place: ``w``
    ``[N, K]`` and ``b`` ``[N]`` are the float weights and bias, ``wq`` (int8), ``bq``
    (integers, float64) and ``real`` (the requantization multipliers) their quantized form.

    A channel keeps its quantization when its multiplier is expressible and its accumulator
    bound (:func:`accumulate_bound` from the actual weights, bias and input zero point) fits
    int32; ``given`` (the model's own parameters) keeps all-zero channels as the model has
    them too. Otherwise its weight scale becomes the smallest of at least ``max |w| / 127``
    that makes the multiplier at least ``2**-32`` and the bias at most ``2**30``: its weights
    move by at most half that scale each. A channel whose weights quantize to zero (and every
    all-zero channel of a calibrated model) outputs its bias: ``bq = round(b / s_out)``,
    multiplier exactly 1, the quantized bias through the requantizer. Each changed channel
    is named in ``warnings``."""
    bound = accumulate_bound(wq, in_zp) + np.abs(bq)
    zero, raised = [], []
    for n in range(len(real)):
        fits = math.isfinite(real[n]) and expressible(real[n]) and bound[n] <= INT32_MAX
        if (fits and (given or w[n].any())) or not math.isfinite(real[n]):
            continue
        s_w = max(float(np.abs(w[n]).max()) / 127.0, _M_MIN * s_out / s_in,
                  abs(float(b[n])) / (s_in * _BIAS_LIMIT))
        q = np.clip(np.rint(w[n] / s_w), -127, 127)
        if not q.any():
            wq[n] = 0
            bq[n] = np.clip(np.rint(b[n] / s_out), -_CONSTANT_LIMIT, _CONSTANT_LIMIT)
            real[n] = 1.0
            if w[n].any() or not fits:
                zero.append((n, float(np.abs(w[n]).max())))
            continue
        wq[n] = q.astype(np.int8)
        bq[n] = np.rint(b[n] / (s_in * s_w))
        real[n] = s_in * s_w / s_out
        raised.append((n, s_w))
    if zero:
        channels = ", ".join(str(n) for n, _ in zero[:8]) + (", ..." if len(zero) > 8 else "")
        largest = max(v for _, v in zero)
        _warn(warnings, f"Layer '{name}': {len(zero)} output channel(s) ({channels}) have "
                        f"(nearly) zero weights (largest |w| {largest:.3g}): each outputs "
                        f"its bias, quantized")
    if raised:
        channels = ", ".join(f"{n} ({s:.3g})" for n, s in raised[:8]) + (
            ", ..." if len(raised) > 8 else "")
        _warn(warnings, f"Layer '{name}': {len(raised)} output channel(s) have weights too "
                        f"small for the requantizer or for their bias at the usual scale; "
                        f"their weight scale is raised (channel (scale): {channels})")


def _warn(warnings: "list[str]", text: str) -> None:
    log.warning("%s", text)
    warnings.append(text)


def check_accumulator(name: str, wq: np.ndarray, bq: np.ndarray, in_zp: int,
                      given: bool) -> None:
    """Refuse a layer whose int32 accumulator could overflow, from its actual integer
    weights, bias and input zero point, saying what the user can do."""
    if np.any(~np.isfinite(bq)):
        raise QuantizationError(f"Layer '{name}': its int32 bias is not a finite number")
    bound = accumulate_bound(wq, in_zp) + np.abs(bq)
    if not np.any(bound > INT32_MAX):
        return
    n = int(np.argmax(bound))
    span = max(int(in_zp) + 128, 127 - int(in_zp))
    hint = (" or quantize the model with smaller weights (or build its float model with "
            "calibration data)") if given else ""
    raise QuantizationError(
        f"Layer '{name}': output channel {n} could overflow the int32 accumulator: "
        f"sum |w| x {span} (the largest |x - zero point|) + |bias| = {int(bound[n])} > "
        f"{INT32_MAX} over its {wq.shape[1]} inputs; split the layer into layers of fewer "
        f"inputs whose outputs an Add sums{hint}")
