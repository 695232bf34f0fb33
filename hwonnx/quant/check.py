"""Golden against the float model, layer by layer, on the calibration data.

RTL equal to golden proves nothing about a golden model that quantized a live signal away (a
residual ``Add`` that rounds one input's weight to 0, a scale that zeroes a branch). So after
calibration every accelerator layer's int8 output, dequantized, is compared with the float
model's value: how much of the float range it still covers, and its largest and mean error
in LSB of its scale. A layer that lost most of its range is a warning naming it.
"""

import logging
from dataclasses import replace

import numpy as np

from ..golden import evaluate
from ..ir import Graph

__all__ = ["LOST_RANGE", "check_layers"]

log = logging.getLogger(__name__)

#: A layer whose int8 output covers less than this share of its float range is a warning.
LOST_RANGE = 0.5


def check_layers(graph: Graph, float_values: "dict[str, np.ndarray]",
                 feeds: "dict[str, np.ndarray]", params: "dict[str, tuple[float, int]]"
                 ) -> Graph:
    """Evaluate the integer ``graph`` on the calibration ``feeds`` and compare each layer
    output ``v:q`` with ``float_values[v]`` (``params[v]``: its scale and zero point).

    Returns the graph with ``meta["layer_check"]``, one row per layer (``layer``,
    ``float_range``, ``int8_range``, ``coverage``, ``max_error_lsb``, ``mean_error_lsb``),
    and a warning in ``meta["warnings"]`` (also logged) for each layer whose coverage is
    below :data:`LOST_RANGE`."""
    env = evaluate(graph, feeds, keep_all=True)
    rows, warnings = [], list(graph.meta.get("warnings", ()))
    for node in graph.nodes:
        out = node.outputs[0] if node.outputs else ""
        value = out[:-2] if out.endswith(":q") else None
        if value not in float_values or value not in params or out not in env:
            continue
        scale, zp = params[value]
        real = float_values[value].astype(np.float64)
        got = (env[out].astype(np.float64) - zp) * scale
        error = np.abs(got.reshape(real.shape) - real) / scale
        span = float(np.ptp(real))
        coverage = float(np.ptp(got)) / span if span > 0 else 1.0
        row = {"layer": node.name, "value": value,
               "float_range": [float(real.min()), float(real.max())],
               "int8_range": [float(got.min()), float(got.max())],
               "coverage": min(coverage, 1.0), "max_error_lsb": float(error.max()),
               "mean_error_lsb": float(error.mean())}
        rows.append(row)
        if coverage < LOST_RANGE:
            text = (f"Layer '{node.name}': its int8 output covers {coverage:.0%} of the float "
                    f"model's range on the calibration data (float [{row['float_range'][0]:.4g}"
                    f", {row['float_range'][1]:.4g}], int8 [{row['int8_range'][0]:.4g}, "
                    f"{row['int8_range'][1]:.4g}]); the quantized model lost most of this "
                    f"signal")
            log.warning("%s", text)
            warnings.append(text)
    return replace(graph, meta={**graph.meta, "layer_check": tuple(rows),
                                "warnings": tuple(warnings)})
