"""Golden against the float model, layer by layer, on the calibration data.

RTL equal to golden proves nothing about a golden model that quantized a live signal away (a
residual ``Add`` that rounds one input's weight to 0, a scale that zeroes a branch). So after
calibration every accelerator layer's int8 output, dequantized, is compared with the float
model's value: how much of the float range it still covers, and its largest and mean error
in LSB of its scale. A layer that lost most of its range is a warning naming it; so is an
output that departs from the float model's by more than :data:`OUTPUT_ERROR` of its range,
naming the layer where the error grows most.
"""

import logging
from dataclasses import replace

import numpy as np

from ..golden import evaluate
from ..ir import Graph

__all__ = ["LOST_RANGE", "OUTPUT_ERROR", "check_layers", "range_error", "output_errors"]

log = logging.getLogger(__name__)

#: A layer whose int8 output covers less than this share of its float range is a warning.
LOST_RANGE = 0.5
#: An output whose RMS error against the float model is more than this share of its float
#: range (on the calibration data) is a warning.
OUTPUT_ERROR = 0.03


def range_error(got: np.ndarray, real: np.ndarray) -> float:
    """The root mean square of ``got - real`` as a share of the range of ``real`` (0 when
    ``real`` is constant)."""
    real = np.asarray(real, np.float64)
    got = np.asarray(got, np.float64).reshape(real.shape)
    span = float(np.ptp(real)) if real.size else 0.0
    return float(np.sqrt(np.mean((got - real) ** 2)) / span) if span > 0 else 0.0


def output_errors(outputs: "tuple[str, ...]", got: "dict[str, np.ndarray]",
                  real: "dict[str, np.ndarray]") -> "dict[str, float]":
    """:func:`range_error` of each of ``outputs`` (values of ``got``, the integer model's,
    against ``real``, the float model's)."""
    return {name: range_error(got[name], real[name]) for name in outputs}


def check_layers(graph: Graph, float_values: "dict[str, np.ndarray]",
                 feeds: "dict[str, np.ndarray]", params: "dict[str, tuple[float, int]]"
                 ) -> Graph:
    """Evaluate the integer ``graph`` on the calibration ``feeds`` and compare each layer
    output ``v:q`` with ``float_values[v]`` (``params[v]``: its scale and zero point).

    Returns the graph with ``meta["layer_check"]``, one row per layer (``layer``,
    ``float_range``, ``int8_range``, ``coverage``, ``max_error_lsb``, ``mean_error_lsb``),
    and a warning in ``meta["warnings"]`` (also logged) for each layer whose coverage is
    below :data:`LOST_RANGE`, and for an output of ``graph`` whose :func:`range_error` is
    above :data:`OUTPUT_ERROR`, naming the layer whose error (RMS, as a share of its range)
    exceeds its inputs' most."""
    env = evaluate(graph, feeds, keep_all=True)
    rows, warnings = [], list(graph.meta.get("warnings", ()))
    errors: "dict[str, float]" = {}         # int8 value -> its range_error
    growth: "dict[str, tuple[float, float]]" = {}     # layer -> (inputs' error, its error)
    for node in graph.nodes:
        out = node.outputs[0] if node.outputs else ""
        value = out[:-2] if out.endswith(":q") else None
        if value not in float_values or value not in params or out not in env:
            continue
        scale, zp = params[value]
        (low, high), int8_range, error, errors[out] = _compared(env[out], scale, zp,
                                                                float_values[value])
        span = high - low
        coverage = (int8_range[1] - int8_range[0]) / span if span > 0 else 1.0
        row = {"layer": node.name, "value": value, "float_range": [low, high],
               "int8_range": int8_range, "coverage": min(coverage, 1.0),
               "max_error_lsb": float(error.max()), "mean_error_lsb": float(error.mean())}
        rows.append(row)
        growth[node.name] = (max((errors.get(v, 0.0) for v in node.inputs), default=0.0),
                             errors[out])
        if coverage < LOST_RANGE:
            text = (f"Layer '{node.name}': its int8 output covers {coverage:.0%} of the float "
                    f"model's range on the calibration data (float [{row['float_range'][0]:.4g}"
                    f", {row['float_range'][1]:.4g}], int8 [{row['int8_range'][0]:.4g}, "
                    f"{row['int8_range'][1]:.4g}]); the quantized model lost most of this "
                    f"signal")
            log.warning("%s", text)
            warnings.append(text)
    outputs = [v for v in graph.outputs if v in env and v in float_values]
    for name, error in output_errors(outputs, env, float_values).items():
        upstream = [n for n in _upstream(graph, name) if n in growth]
        if error > OUTPUT_ERROR and upstream:
            layer = max(upstream, key=lambda k: growth[k][1] - growth[k][0])
            before, after = growth[layer]
            text = (f"The int8 model's output '{name}' departs from the float model's by "
                    f"{error:.1%} of its range (RMS on the calibration data); the error grows "
                    f"most at layer '{layer}' (from {before:.1%} of the range at its input to "
                    f"{after:.1%} at its output); 'hwonnx inspect --calib' compares the "
                    f"calibration methods")
            log.warning("%s", text)
            warnings.append(text)
    return replace(graph, meta={**graph.meta, "layer_check": tuple(rows),
                                "warnings": tuple(warnings)})


def _compared(q: np.ndarray, scale: float, zp: int, real: np.ndarray) -> tuple:
    """A layer's int8 output ``q`` (dequantized by ``scale``, ``zp``) against its float value
    ``real``: the float range, the int8 range (dequantized), each element's error in LSB,
    and :func:`range_error`, with as few passes over the arrays (32 samples of a layer of
    ResNet-18: up to 26 M elements) as the same float64 arithmetic takes: the dequantized
    values by table (``(q - zp) * scale``, each of the 256), the ranges of the arrays as they
    are (float32, int8), the difference once."""
    table = (np.arange(-128, 128, dtype=np.float64) - zp) * scale
    index = q.view(np.uint8) ^ np.uint8(128)                # int8 v -> v + 128
    got = table[index].reshape(real.shape)
    int8_range = [float(table[int(index.min())]), float(table[int(index.max())])] \
        if scale > 0 else [float(got.min()), float(got.max())]
    low, high = float(real.min()), float(real.max())    # (float32 to float64: exact)
    difference = np.subtract(got, real, out=got, dtype=np.float64)
    span = high - low
    rms = float(np.sqrt(np.mean(np.square(difference))) / span) if span > 0 else 0.0
    error = np.divide(np.abs(difference, out=difference), scale, out=difference)
    return (low, high), int8_range, error, rms


def _upstream(graph: Graph, value: str) -> "list[str]":
    """The names of the nodes ``value`` depends on, in graph order."""
    needed, names = {value}, set()
    for node in reversed(graph.nodes):
        if needed.intersection(node.outputs):
            names.add(node.name)
            needed.update(node.inputs)
    return [node.name for node in graph.nodes if node.name in names]
