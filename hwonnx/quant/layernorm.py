"""The integer constants of a quantized ``LayerNormalization``
(:class:`hwonnx.golden.layernorm.LayerNormParams`) from its float parameters and the scales
calibration chose: the choices of the shifts that keep every step of
:func:`hwonnx.golden.layernorm.qlayernorm` within int64 and its multipliers within int16."""

import math

import numpy as np

from ..errors import QuantizationError
from ..golden.layernorm import ISQRT_MAX, LayerNormParams

__all__ = ["layernorm_params", "FRACTION_BITS", "RECIPROCAL_BITS"]

#: Fraction bits of the normalized value ``n`` (its relative rounding error 2^-13 at 1).
FRACTION_BITS = 12
#: The reciprocal ``inv`` has at least this many bits (relative error below 2^-24).
RECIPROCAL_BITS = 24
#: The gamma multipliers ``G`` are int16.
_G_MAX = (1 << 15) - 1
#: The largest ``N^2 var`` of int8 rows: ``N^2 (255/2)^2``, per ``N^2``, rounded up.
_VAR_MAX = 16257


def layernorm_params(name: str, n: int, in_scale: float, gamma, beta, epsilon: float,
                     out_scale: float, out_zp: int) -> LayerNormParams:
    """The constants of ``LayerNormalization`` ``name`` over rows of ``n`` elements, input
    scale ``in_scale``, output scale and zero point ``out_scale``, ``out_zp``.

    Raises
    ------
    QuantizationError
        If ``n`` is not in [1, 2^16), a scale is not positive and finite, or the gamma and
        beta over the output scale cannot be held (a gamma so large that its multiplier needs
        fewer than 1 - F bits of shift, a bias of 2^20 output steps or more); the message
        names the node.
    """
    if not 1 <= n < (1 << 16):
        raise QuantizationError(f"LayerNormalization '{name}' normalizes rows of {n} elements; "
                                f"the integer LayerNorm takes 1 to 65535")
    gamma = np.broadcast_to(np.asarray(gamma, np.float64).reshape(-1), (n,))
    beta = np.broadcast_to(np.asarray(beta, np.float64).reshape(-1), (n,))
    for what, value in (("input scale", in_scale), ("output scale", out_scale),
                        ("epsilon", epsilon + 1.0)):
        if not (math.isfinite(value) and value > 0):
            raise QuantizationError(f"LayerNormalization '{name}' has {what} {value!r}; it must "
                                    f"be positive and finite")
    if not (np.isfinite(gamma).all() and np.isfinite(beta).all()):
        raise QuantizationError(f"LayerNormalization '{name}' has a scale or bias that is not "
                                f"finite")
    e_real = n * n * epsilon / in_scale ** 2
    for a in range(32, -1, -2):                        # the most bits that fit: isqrt's domain
        e = round(e_real * 2.0 ** a)
        if (n * n * _VAR_MAX << a) + e <= ISQRT_MAX:
            break
    else:
        raise QuantizationError(f"LayerNormalization '{name}' has epsilon {epsilon:g} at input "
                                f"scale {in_scale:g}: N^2 eps / s^2 = {e_real:g} is too large "
                                f"for the integer square root")
    root_max = math.isqrt((n * n * _VAR_MAX << a) + e)
    m = root_max.bit_length() + RECIPROCAL_BITS
    f = FRACTION_BITS
    ratio = float(np.abs(gamma).max()) / out_scale
    g = 16 if ratio == 0 else min(16, math.floor(math.log2(_G_MAX / ratio)))
    s2 = f + g
    if s2 < 1 or m - a // 2 - f < 1:
        raise QuantizationError(f"LayerNormalization '{name}' has a gamma of up to "
                                f"{ratio:g} output steps; the integer LayerNorm takes at most "
                                f"{_G_MAX * 2 ** (f - 1):g}")
    big_g = np.round(gamma / out_scale * 2.0 ** g).astype(np.int64)
    bias = beta / out_scale * 2.0 ** s2
    if np.abs(beta).max() / out_scale >= 2.0 ** 20:
        raise QuantizationError(f"LayerNormalization '{name}' has a bias of "
                                f"{np.abs(beta).max() / out_scale:g} output steps; the integer "
                                f"LayerNorm takes less than 2^20")
    return LayerNormParams(n=n, a=a, e=e, m=m, f=f, s2=s2, gamma=big_g,
                           beta=np.round(bias).astype(np.int64), zero_point=int(out_zp))
