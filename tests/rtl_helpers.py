"""What the model-level RTL tests share: the array configurations of tests/test_rtl.py (whose
Verilator builds are cached) and He-normal test weights."""

import numpy as np

from hwonnx.config import ArchConfig

#: The 8x8 default and the 3x5 configuration of tests/test_rtl.py (cached Verilator builds).
CONFIGS = {
    "8x8": ArchConfig(),
    "3x5": ArchConfig(rows=3, cols=5, act_depth=2048, wgt_depth=1024, acc_depth=64,
                      par_depth=64, prog_depth=2048),
}


def he_weight(rng, *shape, gain=1.0) -> np.ndarray:
    """float32 weights of ``shape`` (output first), He-normal scaled by ``gain``."""
    fan_in = int(np.prod(shape[1:]))
    return (rng.normal(0, gain * (2 / fan_in) ** 0.5, shape)).astype(np.float32)
