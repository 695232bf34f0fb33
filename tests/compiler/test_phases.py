"""The phase decomposition of a transposed convolution (hwonnx/compiler/phases.py): on random
strides, kernels, pads and output paddings, the phases' stride-1 convolutions, written where
their scatter says, cover every output pixel exactly once and equal the transposed convolution
by its definition (hwonnx.golden.transposed.scatter)."""

import numpy as np
import pytest

from hwonnx.compiler.phases import phases
from hwonnx.golden.transposed import scatter


def _correlate(x, w, pads, out_hw):
    """A stride-1 correlation, written out: output (oy, ox) reads x[oy + t - top, ox + u -
    left] (zero outside), so negative pads start the window inside the input."""
    n, c, h, wd = x.shape
    y = np.zeros((n, w.shape[0]) + tuple(out_hw), dtype=x.dtype)
    for oy in range(out_hw[0]):
        for ox in range(out_hw[1]):
            for t in range(w.shape[2]):
                for u in range(w.shape[3]):
                    iy, ix = oy + t - pads[0], ox + u - pads[1]
                    if 0 <= iy < h and 0 <= ix < wd:
                        y[:, :, oy, ox] += x[:, :, iy, ix] @ w[:, :, t, u].T
    return y


@pytest.mark.parametrize("seed", range(6))
def test_phases_equal_the_definition(seed):
    rng = np.random.default_rng(seed)
    checked = 0
    while checked < 50:
        s = tuple(int(v) for v in rng.integers(1, 4, 2))
        k = tuple(int(v) for v in rng.integers(1, 5, 2))
        h, wd = (int(v) for v in rng.integers(1, 5, 2))
        begin = [int(rng.integers(0, k[0])), int(rng.integers(0, k[1]))]
        end = [int(rng.integers(0, k[0])), int(rng.integers(0, k[1]))]
        outpad = [int(rng.integers(0, s[0])), int(rng.integers(0, s[1]))]
        out = (s[0] * (h - 1) + outpad[0] + k[0] - begin[0] - end[0],
               s[1] * (wd - 1) + outpad[1] + k[1] - begin[1] - end[1])
        if min(out) <= 0:
            continue
        x = rng.integers(-128, 128, (1, 2, h, wd))
        w = rng.integers(-127, 128, (3, 2) + k)
        pads = (begin[0], begin[1], end[0], end[1])
        want = scatter(x, w, s, pads, out, 1)
        got = np.zeros_like(want)
        written = np.zeros(out, dtype=int)
        for phase in phases(w, s, pads, (h, wd), out):
            assert min(phase.pads[2:]) >= 0
            sy, sx, oy, ox, width = phase.scatter
            assert width == out[1]
            y = _correlate(x, phase.weight, phase.pads, phase.out_hw)
            rows = oy + sy * np.arange(phase.out_hw[0])
            cols = ox + sx * np.arange(phase.out_hw[1])
            got[:, :, rows[:, None], cols[None, :]] = y
            written[rows[:, None], cols[None, :]] += 1
        assert (written == 1).all(), (s, k, pads, outpad)
        np.testing.assert_array_equal(got, want)
        checked += 1
