"""The integer definition of ``LayerNormalization`` (issue 38): int8 in, int8 out, every step
an integer operation an engine can implement, and no float at run time.

For one row ``q`` of ``N`` int8 values (the normalized axes, flattened last) with input scale
``s_x`` (the zero point cancels), the float definition ``(x - mean) / sqrt(var + eps) * gamma +
beta`` is, exactly, ``d_i / sqrt(T) * gamma_i + beta_i`` with

* ``S = sum q``, ``d_i = N q_i - S`` (N times the deviation from the mean),
* ``V = N sum q^2 - S^2`` (``N^2`` times the variance; ``V = sum_{i<j} (q_i - q_j)^2``, so
  ``V = 0`` or ``V >= N - 1``),
* ``T = V + N^2 eps / s_x^2``.

The integer version (constants of the layer in :class:`LayerNormParams`, made by
:func:`hwonnx.quant.layernorm.layernorm_params`):

1. ``T' = max(V 2^a + E, 1)`` with ``E = round(N^2 eps / s_x^2 2^a)``;
2. ``root = isqrt(T')`` (floor of the square root, :func:`isqrt`: integer Newton iteration);
3. ``inv = floor(2^M / root)`` (one reciprocal per row);
4. ``n_i = (d_i inv + 2^(s1-1)) >> s1``, the normalized value with ``F`` fraction bits
   (``s1 = M - a/2 - F``);
5. ``y_i = clamp(zp + ((n_i G_i + B_i + 2^(s2-1)) >> s2), lo, hi)`` with the int16 gamma
   multipliers ``G_i = round(gamma_i / s_y 2^(s2-F))`` and the biases ``B_i = round(beta_i /
   s_y 2^s2)``.

Rounding is half up (an arithmetic shift of the value plus half), as in
:func:`hwonnx.golden.ops.requantize`. Every intermediate fits int64 for ``N < 2^16``
(:func:`hwonnx.quant.layernorm.layernorm_params` chooses ``a`` and ``M`` so). The error
against the float definition, in output steps, is bounded by :func:`error_bound`.
"""

from dataclasses import dataclass

import numpy as np

__all__ = ["LayerNormParams", "isqrt", "row_statistics", "qlayernorm", "error_bound"]

#: The largest value :func:`isqrt` takes (its Newton iteration squares values below 2^31.5).
ISQRT_MAX = (1 << 62) - 1


@dataclass(frozen=True)
class LayerNormParams:
    """The integer constants of one ``LayerNormalization`` (module docstring, steps 1-5)."""
    n: int                   # elements per row
    a: int                   # even: T' = V 2^a + E
    e: int                   # E
    m: int                   # inv = floor(2^m / root)
    f: int                   # fraction bits of the normalized value
    s2: int                  # final shift
    gamma: np.ndarray        # G, int64 [N] (within int16)
    beta: np.ndarray         # B, int64 [N]
    zero_point: int
    lo: int = -128
    hi: int = 127

    @property
    def s1(self) -> int:
        return self.m - self.a // 2 - self.f


def isqrt(n: np.ndarray) -> np.ndarray:
    """``floor(sqrt(n))`` of int64 ``n`` in ``[0, 2^62)``, exactly: the integer Newton
    iteration ``x <- (x + n // x) // 2`` from a power of two at or above the root, which
    decreases monotonically to the floor of the root and stops when it no longer decreases
    (I-BERT's ``I-SQRT``)."""
    n = np.asarray(n, dtype=np.int64)
    if n.size and (n.min() < 0 or n.max() > ISQRT_MAX):
        raise ValueError(f"isqrt takes integers in [0, 2^62), not {n.min()} .. {n.max()}")
    bits = np.zeros(n.shape, dtype=np.int64)
    rest = n.copy()
    for step in (32, 16, 8, 4, 2, 1):                     # bit length of n, exactly
        big = rest >= (np.int64(1) << step)
        bits += np.where(big, step, 0)
        rest = np.where(big, rest >> step, rest)
    bits += (rest > 0)
    x = np.int64(1) << ((bits + 1) // 2)                  # 2^ceil(bits/2) > sqrt(n)
    while True:
        nxt = (x + n // np.maximum(x, 1)) >> 1
        done = nxt >= x
        if done.all():
            return np.where(n == 0, 0, x)
        x = np.where(done, x, nxt)


def row_statistics(q: np.ndarray) -> "tuple[np.ndarray, np.ndarray]":
    """``d = N q - S`` and ``V = N sum q^2 - S^2`` per row (last axis) of int8 ``q``, int64;
    ``V`` has a trailing axis of 1."""
    q = q.astype(np.int64)
    n = q.shape[-1]
    s = q.sum(axis=-1, keepdims=True)
    return n * q - s, n * (q * q).sum(axis=-1, keepdims=True) - s * s


def qlayernorm(q: np.ndarray, p: LayerNormParams) -> np.ndarray:
    """The integer ``LayerNormalization`` of int8 ``q`` over its last axis (module docstring)."""
    if q.shape[-1] != p.n:
        raise ValueError(f"QLayerNorm of rows of {p.n} elements, not {q.shape[-1]}")
    d, v = row_statistics(q)
    t = np.maximum((v << p.a) + p.e, 1)
    inv = (np.int64(1) << p.m) // isqrt(t)
    n = ((d * inv >> (p.s1 - 1)) + 1) >> 1
    acc = n * p.gamma + p.beta
    y = ((acc >> (p.s2 - 1)) + 1) >> 1
    return np.clip(y + p.zero_point, p.lo, p.hi).astype(np.int8)


def error_bound(p: LayerNormParams, gamma: np.ndarray, beta: np.ndarray,
                out_scale: float) -> float:
    """An upper bound, in output steps, on ``|y - zp - u|`` for :func:`qlayernorm`'s ``y``
    and ``u`` the float definition on the same (dequantized) input divided by the output
    scale, ``u`` clamped to ``[lo - zp, hi - zp]``. The terms:

    * 0.5: the final rounding;
    * ``|gamma_i| / s_y (sqrt(N) eps_rel + 2^-(F+1))``: the normalized value's relative error
      (``root`` and ``inv`` floored, ``E`` rounded) times its largest size ``sqrt(N)``
      (``|d_i| / sqrt(T) <= sqrt(N)`` as ``sum d^2 = N V``), and its rounding to ``F`` bits;
    * ``(sqrt(N) (1 + eps_rel) + 2^-(F+1)) |G_i 2^(F-s2) - gamma_i / s_y|``: the gamma
      multiplier's rounding, times the largest normalized value;
    * ``|B_i 2^-s2 - beta_i / s_y|``: the bias's rounding.

    ``eps_rel`` bounds the relative error of ``inv 2^-(M - a/2)`` against ``1 / sqrt(T)`` for
    a row with ``V >= N - 1``: ``1 / (r - 1)`` for the floored root (``r = sqrt((N-1) 2^a)``,
    the smallest ``sqrt(T')``), ``1 / inv_min`` for the floored reciprocal (``inv_min`` at the
    largest ``T'``, ``V = N^2 127.5^2``), ``0.25 / r^2`` for ``E`` rounded; their product's
    excess over 1 is below their sum times ``1 + 2 sum``. A row with ``V = 0`` has ``d = 0``:
    its output is the bias, and only the rounding terms apply.
    """
    gamma = np.asarray(gamma, np.float64).reshape(-1)
    beta = np.asarray(beta, np.float64).reshape(-1)
    root_min = np.sqrt(max(p.n - 1, 1) * 2.0 ** p.a)
    root_max = np.sqrt(p.n * p.n * 127.5 ** 2 * 2.0 ** p.a + p.e) + 1
    inv_min = np.floor(2.0 ** p.m / root_max)
    eps_rel = 1 / (root_min - 1) + 1 / inv_min + 0.25 / root_min ** 2
    eps_rel *= 1 + 2 * eps_rel                           # the product of the three factors
    half = 2.0 ** -(p.f + 1)
    largest = np.sqrt(p.n) * (1 + eps_rel) + half
    g_err = np.abs(p.gamma * 2.0 ** (p.f - p.s2) - gamma / out_scale)
    b_err = np.abs(p.beta * 2.0 ** -p.s2 - beta / out_scale)
    terms = (np.abs(gamma) / out_scale * (np.sqrt(p.n) * eps_rel + half)
             + largest * g_err + b_err)
    return float(0.5 + terms.max())
