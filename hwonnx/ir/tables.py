"""The table operators: every ONNX element-wise function of one value that the accelerator
computes as a 256-entry int8 lookup table in the post-processor (the layer's output, quantized,
is the table's index; :func:`hwonnx.quant.tables.activation_table` builds the table).

:data:`TABLE_OPS` is the one list of them: the frontend's supported operators and converters
(:mod:`hwonnx.frontend.support`, :mod:`hwonnx.frontend.convert`), the float evaluator
(:data:`hwonnx.ir.evaluate.TABLE_FUNCTIONS`) and the quantizer derive from it. Each float
function follows the ONNX operator's definition in float32, with the ONNX defaults of its
attributes; the float IR op keeps the ONNX name and the attributes (all of them, defaults
filled in)."""

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

__all__ = ["TableOp", "TABLE_OPS"]

_F = np.float32


@dataclass(frozen=True)
class TableOp:
    """One table operator: ``fn(x, attrs)`` (float32 array in, float32 array out; ``attrs``
    holds every attribute of :attr:`defaults`), the ONNX default of each attribute, the
    allowed values of its string attributes, the ai.onnx opset that introduced it (for the
    documentation) and ``slope(attrs)``, the function's largest slope on the reals (its
    Lipschitz constant; None where it has none: a jump, or unbounded growth), which bounds
    how far the rounding of the table's input moves its output. ``onnx``: an ai.onnx
    operator of that name (False: a float IR op only, made by :mod:`hwonnx.frontend.patterns`
    from several ONNX nodes)."""
    fn: Callable[[np.ndarray, dict], np.ndarray]
    defaults: dict = field(default_factory=dict)
    choices: dict = field(default_factory=dict)
    since: int = 1
    slope: "Callable[[dict], float | None]" = lambda attrs: None
    onnx: bool = True


def _sigmoid(x):
    e = np.exp(-np.abs(x))                    # no overflow for large |x|
    return np.where(x >= 0, _F(1) / (_F(1) + e), e / (_F(1) + e))


def _hard_sigmoid(x, alpha, beta):
    return np.clip(_F(alpha) * x + _F(beta), 0, 1)


def _expm1_neg(x):
    """exp(min(x, 0)) - 1: the negative branch of Elu/Selu/Celu, without overflow for the
    positive values it is not used on."""
    return np.exp(np.minimum(x, _F(0))) - _F(1)


def _softplus(x):
    # log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|))
    return (np.maximum(x, _F(0)) + np.log1p(np.exp(-np.abs(x)))).astype(_F)


_erf_scalar = np.vectorize(math.erf, otypes=[np.float64])


def _erf(x):
    """ONNX Erf in float32 (computed in double, rounded once)."""
    x = np.asarray(x, _F)
    return _erf_scalar(x.astype(np.float64)).astype(_F) if x.size else x.copy()


def _gelu(x, attrs):
    if attrs["approximate"] == "tanh":
        inner = _F(math.sqrt(2 / math.pi)) * (x + _F(0.044715) * x * x * x)
        return _F(0.5) * x * (_F(1) + np.tanh(inner))
    return _F(0.5) * x * (_F(1) + _erf(x * _F(1 / math.sqrt(2))))


#: The table operators, by ONNX (and float IR) op name.
TABLE_OPS: "dict[str, TableOp]" = {
    "LeakyRelu": TableOp(lambda x, a: np.where(x >= 0, x, x * _F(a["alpha"])),
                         {"alpha": 0.01}, since=6, slope=lambda a: max(1.0, abs(a["alpha"]))),
    "Sigmoid": TableOp(lambda x, a: _sigmoid(x), slope=lambda a: 0.25),
    "Tanh": TableOp(lambda x, a: np.tanh(x), slope=lambda a: 1.0),
    "HardSigmoid": TableOp(lambda x, a: _hard_sigmoid(x, a["alpha"], a["beta"]),
                           {"alpha": 0.2, "beta": 0.5}, since=6,
                           slope=lambda a: abs(a["alpha"])),
    "HardSwish": TableOp(lambda x, a: x * _hard_sigmoid(x, 1 / 6, 0.5), since=14,
                         slope=lambda a: 1.5),
    # Elu: x for x > 0, alpha (e^x - 1) otherwise.
    "Elu": TableOp(lambda x, a: np.where(x > 0, x, _F(a["alpha"]) * _expm1_neg(x)),
                   {"alpha": 1.0}, since=6, slope=lambda a: max(1.0, abs(a["alpha"]))),
    # Selu: gamma x for x > 0, gamma (alpha e^x - alpha) otherwise.
    "Selu": TableOp(lambda x, a: np.where(x > 0, _F(a["gamma"]) * x,
                                          _F(a["gamma"]) * _F(a["alpha"]) * _expm1_neg(x)),
                    {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875},
                    since=6, slope=lambda a: abs(a["gamma"]) * max(1.0, abs(a["alpha"]))),
    # Celu: max(0, x) + min(0, alpha (e^(x / alpha) - 1)).
    "Celu": TableOp(lambda x, a: np.maximum(x, _F(0)) + np.minimum(
                        _F(0), _F(a["alpha"]) * _expm1_neg(x / _F(a["alpha"]))),
                    {"alpha": 1.0}, since=12, slope=lambda a: 1.0),
    "Softplus": TableOp(lambda x, a: _softplus(x), slope=lambda a: 1.0),
    "Softsign": TableOp(lambda x, a: x / (_F(1) + np.abs(x)), slope=lambda a: 1.0),
    # Gelu: x Phi(x), or its tanh approximation; the largest slope of both is 1.129.
    "Gelu": TableOp(_gelu, {"approximate": "none"}, {"approximate": ("none", "tanh")},
                    since=20, slope=lambda a: 1.13),
    # Mish: x tanh(softplus(x)); its largest slope is 1.0900.
    "Mish": TableOp(lambda x, a: x * np.tanh(_softplus(x)), since=18, slope=lambda a: 1.091),
    # ThresholdedRelu: x for x > alpha, else 0 (a jump of alpha: no slope bound).
    "ThresholdedRelu": TableOp(lambda x, a: np.where(x > _F(a["alpha"]), x, _F(0)),
                               {"alpha": 1.0}, since=10),
    "Exp": TableOp(lambda x, a: np.exp(x)),
    "Neg": TableOp(lambda x, a: -x, slope=lambda a: 1.0),
    "Abs": TableOp(lambda x, a: np.abs(x), slope=lambda a: 1.0),
    "Erf": TableOp(lambda x, a: _erf(x), since=9, slope=lambda a: 2 / math.sqrt(math.pi)),
    # Swish (ai.onnx 24): x sigmoid(alpha x), SiLU for alpha = 1. Its slope is
    # sigmoid(u) + u sigmoid'(u) at u = alpha x, whatever alpha: at most 1.0998 (u = 2.3994).
    "Swish": TableOp(lambda x, a: x * _sigmoid(_F(a["alpha"]) * x), {"alpha": 1.0}, since=24,
                     slope=lambda a: 1.0999),
    # x HardSigmoid(x) with any alpha, beta (HardSwish is alpha = 1/6, beta = 0.5): written as
    # HardSigmoid and Mul by exporters. Its slope is 2 alpha x + beta on the ramp (from -beta
    # to 2 - beta), 1 or 0 off it: at most 2 + |beta|.
    "XHardSigmoid": TableOp(lambda x, a: x * _hard_sigmoid(x, a["alpha"], a["beta"]),
                            {"alpha": 0.2, "beta": 0.5}, slope=lambda a: 2 + abs(a["beta"]),
                            onnx=False),
    # Functions outside their domain (Log and Sqrt of a negative value, Log and Reciprocal of
    # 0) give NaN or an infinity; activation_table saturates an infinity and maps NaN to -128
    # (what onnxruntime's QuantizeLinear gives). No slope bound: unbounded near 0.
    "Log": TableOp(lambda x, a: np.log(x)),
    "Sqrt": TableOp(lambda x, a: np.sqrt(x)),
    "Reciprocal": TableOp(lambda x, a: _F(1) / x),
    # Steps: a jump of 1 (2 for Sign) at each integer (at 0), flat between (no slope bound).
    "Sign": TableOp(lambda x, a: np.sign(x), since=9),
    "Floor": TableOp(lambda x, a: np.floor(x)),
    "Ceil": TableOp(lambda x, a: np.ceil(x)),
    "Round": TableOp(lambda x, a: np.rint(x), since=11),         # half to even, as ONNX
}
