"""Suite-wide pytest set-up.

``pytest`` runs the suite in parallel with pytest-xdist (``addopts`` in pyproject.toml:
``-n auto --dist worksteal``; ``-n 0`` runs it serially). The workers share the on-disk build
cache (``$HWONNX_CACHE``, else ``~/.cache/hwonnx``): ``hwonnx.sim.runner.build_lock`` makes one
process build each Verilator model while the others wait for it and then reuse it. See
docs/testing.md.
"""


def pytest_report_header(config):
    from hwonnx.sim.runner import cache_root

    return [f"hwonnx build cache: {cache_root()}"]
