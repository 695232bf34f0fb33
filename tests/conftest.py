"""Fixtures every test runs under, and the suite's set-up.

``pytest`` runs the suite in parallel with pytest-xdist (``addopts`` in pyproject.toml:
``-n auto --dist worksteal``; ``-n 0`` runs it serially). The workers share the on-disk build
cache (``$HWONNX_CACHE``, else ``~/.cache/hwonnx``): ``hwonnx.sim.runner.build_lock`` makes one
process build each Verilator model while the others wait for it and then reuse it. See
docs/testing.md.
"""

import pytest

from hwonnx.examples import load_digits_data
from ort_reference import guard_optimized_int8_sessions


@pytest.fixture(autouse=True)
def _no_optimized_int8_sessions(monkeypatch):
    """No test's outcome may depend on the CPU's SIMD instructions: onnxruntime's optimized
    session refuses a quantized model (see ``ort_reference``)."""
    guard_optimized_int8_sessions(monkeypatch)


def pytest_report_header(config):
    from hwonnx.sim.runner import cache_root

    return [f"hwonnx build cache: {cache_root()}"]


@pytest.fixture(scope="session")
def digits():
    """The bundled digits data set (calibration and test images)."""
    return load_digits_data()
