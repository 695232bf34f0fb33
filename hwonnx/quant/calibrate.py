"""Calibration methods: the float range ``[lo, hi]`` an activation's int8 scale and zero point
cover (:func:`~hwonnx.quant.params.activation_params`), from its values on the calibration
samples.

- ``minmax`` (the default): the smallest and largest value.
- ``percentile``: onnxruntime's ``CalibrationMethod.Percentile`` with its defaults: a
  histogram of the absolute values in 2,048 bins (symmetric), the bin edge where the
  cumulative share reaches 99.999 %, as ``[-t, t]`` within ``[min, max]``.
- ``entropy``: onnxruntime's ``CalibrationMethod.Entropy``: a histogram of the values over
  ``[-T, T]`` (``T`` the largest magnitude), the symmetric window whose quantization into 128
  bins keeps the KL divergence from the histogram smallest (:mod:`.entropy`), within
  ``[min, max]``. onnxruntime's default histogram for it has 128 bins, which leaves one
  window, the whole range (the same range as ``minmax``); hwonnx uses 2,048 bins (its
  percentile default, and TensorRT's), as ``create_calibrator(..., extra_options={"num_bins":
  2048})`` does.
- ``mse``: not an onnxruntime method. The range ``[a * lo, a * hi]`` (``lo``, ``hi``: the
  min/max range with 0 in it; ``a`` one of 256 steps from 1/256 to 1) whose int8 quantization,
  with the scale and zero point hwonnx gives it, has the smallest mean squared error over a
  histogram of the values in 2,048 bins: a bin beyond the representable range contributes its
  clipping error (centre to the range's end, squared), a bin within it the rounding error of
  uniform noise, ``scale**2 / 12``.

The histogram methods work in float32 (onnxruntime calibrates float32 tensors); every method
returns the range as Python floats.
"""

import numpy as np

from ..errors import UsageError
from .entropy import entropy_threshold
from .params import activation_params

__all__ = ["METHODS", "DEFAULT_METHOD", "PERCENTILE", "HISTOGRAM_BINS", "QUANTIZED_BINS",
           "MSE_STEPS", "check_method", "calibrated_range", "describe_method", "Ranges"]

METHODS = ("minmax", "percentile", "entropy", "mse")
DEFAULT_METHOD = "minmax"
#: onnxruntime's defaults: the percentile kept, the percentile histogram's bins (hwonnx's
#: for entropy and mse too), and entropy's quantized bins.
PERCENTILE = 99.999
HISTOGRAM_BINS = 2048
QUANTIZED_BINS = 128
#: The candidate ranges of ``mse``: shares 1/MSE_STEPS ... 1 of the min/max range.
MSE_STEPS = 256


def check_method(method: str) -> str:
    """``method`` if it names a calibration method, else a :class:`UsageError`."""
    if method not in METHODS:
        raise UsageError(f"Calibration method must be one of {', '.join(METHODS)}, "
                         f"not {method!r}")
    return method


def describe_method(method: str) -> str:
    """The method as the build report says it (``min-max`` as before the other methods)."""
    return {"minmax": "min-max",
            "percentile": f"percentile {PERCENTILE} (symmetric, {HISTOGRAM_BINS} bins, as "
                          f"onnxruntime)",
            "entropy": f"entropy (KL divergence, {HISTOGRAM_BINS} bins into "
                       f"{QUANTIZED_BINS}, as onnxruntime)",
            "mse": f"mse (smallest quantization error over {HISTOGRAM_BINS} bins)"}[method]


def calibrated_range(values: np.ndarray, method: str = DEFAULT_METHOD) -> "tuple[float, float]":
    """The range of ``values`` (any shape, finite) that ``method`` gives."""
    values = np.asarray(values)
    if method == "minmax" or values.size == 0 or values.min() == values.max():
        return float(values.min()), float(values.max())
    data = values.astype(np.float32, copy=False).reshape(-1)
    return {"percentile": _percentile, "entropy": _entropy, "mse": _mse}[method](data)


class Ranges:
    """The calibrated range of each value of ``values`` (name -> its calibration values) by
    ``method``, computed once per value."""

    def __init__(self, values: "dict[str, np.ndarray]", method: str = DEFAULT_METHOD):
        self.values, self.method = values, check_method(method)
        self._cache: "dict[str, tuple[float, float]]" = {}

    def __call__(self, name: str) -> "tuple[float, float]":
        if name not in self._cache:
            self._cache[name] = calibrated_range(self.values[name], self.method)
        return self._cache[name]


def _percentile(data: np.ndarray) -> "tuple[float, float]":
    """onnxruntime's ``compute_percentile`` of a ``collect_absolute_value`` histogram."""
    low, high = data.min(), data.max()
    hist, edges = np.histogram(np.absolute(data), bins=HISTOGRAM_BINS)
    edges = edges.astype(data.dtype)
    cdf = np.cumsum(hist / hist.sum())
    t = edges[np.searchsorted(cdf, PERCENTILE / 100.0)]
    return float(max(-t, low)), float(min(t, high))


def _entropy(data: np.ndarray) -> "tuple[float, float]":
    """onnxruntime's ``compute_entropy`` of a ``collect_value`` histogram."""
    low, high = data.min(), data.max()
    threshold = np.array(max(abs(low), abs(high)), dtype=data.dtype)
    hist, edges = np.histogram(data, HISTOGRAM_BINS, range=(-threshold, threshold))
    return entropy_threshold(hist, edges, low, high, QUANTIZED_BINS)


def _mse(data: np.ndarray) -> "tuple[float, float]":
    lo, hi = min(float(data.min()), 0.0), max(float(data.max()), 0.0)
    hist, edges = np.histogram(data.astype(np.float64), bins=HISTOGRAM_BINS, range=(lo, hi))
    centres = (edges[:-1] + edges[1:]) / 2
    shares = np.arange(1, MSE_STEPS + 1) / MSE_STEPS
    errors = np.empty(MSE_STEPS)
    for k, share in enumerate(shares):
        scale, zp = activation_params(share * lo, share * hi)
        first, last = (-128 - zp) * scale, (127 - zp) * scale
        clipped = np.where(centres < first, first - centres,
                           np.where(centres > last, centres - last, 0.0))
        inside = (centres >= first) & (centres <= last)
        errors[k] = (hist * (clipped ** 2 + np.where(inside, scale ** 2 / 12, 0.0))).sum()
    best = shares[int(np.argmin(errors))]
    return float(best * lo), float(best * hi)
