"""Quantization: post-training quantization of float graphs with calibration data, or with
the parameters of a pre-quantized model; onnxruntime's rounding for comparison."""

from .data import load_samples, normalize_samples
from .host import quantize_model
from .ort_rounding import evaluate_onnxruntime, requantize_float32
from .params import activation_params, requant_params
from .ptq import CALIBRATION_METHOD, quantize_graph
from .tables import activation_table
from .residual import add_weights, adds_on_array

__all__ = ["CALIBRATION_METHOD", "activation_params", "activation_table", "add_weights",
           "adds_on_array", "evaluate_onnxruntime", "load_samples", "normalize_samples",
           "quantize_graph", "quantize_model", "requant_params", "requantize_float32"]
