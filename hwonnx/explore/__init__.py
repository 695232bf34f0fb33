"""``hwonnx explore``: sweep architecture configurations of a model on a board on Dask
distributed, and write the points, their Pareto front and a recommendation
(``docs/explore.md``).

:mod:`.space` (the points), :mod:`.point` (one point, a Dask task), :mod:`.sweep` (the run),
:mod:`.pareto` (dominance, fronts, the recommendation), :mod:`.outputs` (``explore.json``,
``.md``, ``.png``), :mod:`.progress` (the terminal's progress bar)."""

from .pareto import dominates, front
from .space import parse_depths, parse_sizes

__all__ = ["explore", "dominates", "front", "parse_sizes", "parse_depths"]


def explore(*args, **kwargs) -> dict:
    """:func:`hwonnx.explore.sweep.explore` (imported on use: Dask loads in about a second)."""
    from .sweep import explore as run
    return run(*args, **kwargs)
