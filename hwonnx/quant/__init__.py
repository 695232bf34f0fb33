"""Quantization: post-training quantization of float graphs with calibration data."""

from .data import load_samples, normalize_samples
from .ptq import CALIBRATION_METHOD, activation_params, quantize_graph, requant_params

__all__ = ["CALIBRATION_METHOD", "activation_params", "load_samples", "normalize_samples",
           "quantize_graph", "requant_params"]
