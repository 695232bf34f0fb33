"""Fixtures every test runs under."""

import pytest

from ort_reference import guard_optimized_int8_sessions


@pytest.fixture(autouse=True)
def _no_optimized_int8_sessions(monkeypatch):
    """No test's outcome may depend on the CPU's SIMD instructions: onnxruntime's optimized
    session refuses a quantized model (see ``ort_reference``)."""
    guard_optimized_int8_sessions(monkeypatch)
