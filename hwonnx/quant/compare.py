"""Comparing the calibration methods on a model: each one's output error against the float
model (``hwonnx inspect --calib``)."""

import logging

import numpy as np

from ..golden import evaluate
from ..ir import Graph
from ..ir.evaluate import evaluate_float
from .calibrate import METHODS
from .check import output_errors
from .data import calibration_feeds
from .host import quantize_model

__all__ = ["compare_methods", "best_method"]


def compare_methods(graph: Graph, samples: "dict[str, np.ndarray]",
                    methods: "tuple[str, ...]" = METHODS) -> "list[dict]":
    """Quantize the float ``graph`` with each of ``methods`` on the calibration ``samples``
    and run the integer graph (the golden model) and the float graph on them. One row per
    method: ``method``, ``errors`` (each float output's RMS error as a share of its float
    range, :func:`~hwonnx.quant.check.range_error`) and ``error``, the largest of them.
    What the quantizer logs (the same for every method, mostly) is not logged here."""
    feeds = calibration_feeds(graph, samples)
    real = evaluate_float(graph, feeds)
    outputs = tuple(v for v in graph.outputs if np.asarray(real[v]).dtype.kind == "f")
    quant_log = logging.getLogger("hwonnx.quant")
    level = quant_log.level
    quant_log.setLevel(logging.ERROR)
    rows = []
    try:
        for method in methods:
            got = evaluate(quantize_model(graph, samples, method), feeds)
            errors = output_errors(outputs, got, real)
            rows.append({"method": method, "errors": errors,
                         "error": max(errors.values(), default=0.0)})
    finally:
        quant_log.setLevel(level)
    return rows


def best_method(rows: "list[dict]") -> str:
    """The method of :func:`compare_methods`'s rows with the smallest ``error`` (the first of
    equal ones, in the order of the rows)."""
    return min(rows, key=lambda row: row["error"])["method"]
