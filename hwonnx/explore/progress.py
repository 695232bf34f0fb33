"""The sweep's progress on the terminal: a rich progress bar of the points (done of total,
elapsed time) under one line per finished point; without a terminal (CI, a file, the tests)
only the lines, on stderr."""

import sys
from contextlib import contextmanager

from .pareto import format_ms

__all__ = ["SweepProgress", "point_line"]


def point_line(record: dict, done: int, total: int) -> str:
    """``[3/9] 8x8: 1,541 cycles, 61.6 us at 25 MHz; 112 DSP, 50 BRAM, 13,640 LUT (3.1 s)``"""
    head = f"[{done}/{total}] {record['array']}: "
    took = f" ({record['seconds']:.1f} s)" if record.get("seconds") is not None else ""
    if record["status"] == "ok":
        used = record["resources"]
        clock = (f"Fmax {record['fmax_mhz']:g} MHz" if record.get("fmax_mhz")
                 else f"{record['clock_mhz']:g} MHz")
        sim = (f"; RTL = golden on {record['sim']['samples']} sample(s)" if record.get("sim")
               else "")
        return (f"{head}{record['predicted_cycles']:,} cycles, "
                f"{format_ms(record['latency_s'])} at {clock}; {used['dsp']:,} DSP, "
                f"{used['bram']:,} BRAM, {used['luts']:,} LUT"
                f"{sim}{took}")
    status = {"does-not-fit": "does not fit", "timeout": "timed out"}.get(record["status"],
                                                                          record["status"])
    reason = str(record.get("reason") or "").split("; try ")[0]   # the advice: in the files
    if len(reason) > 200:
        reason = reason[:197] + "..."
    return f"{head}{status}: {reason}{took}"


class SweepProgress:
    """``log`` for messages, ``start`` and ``point`` (the ``on_start`` and ``on_point`` of
    :func:`hwonnx.explore.explore`) for the points; inside :meth:`shown`, on a terminal, a
    progress bar under the lines."""

    def __init__(self) -> None:
        self._progress = None
        self._task = None

    def log(self, message: str) -> None:
        if self._progress is None:
            print(message, file=sys.stderr, flush=True)
        else:
            self._progress.console.print(message, markup=False, highlight=False, emoji=False,
                                         soft_wrap=True)

    def start(self, total: int) -> None:
        """The ``on_start`` of :func:`hwonnx.explore.explore`: ``total`` points to run."""
        if self._progress is not None and self._task is None:
            self._task = self._progress.add_task("Sweep points", total=total)

    def point(self, record: dict, done: int, total: int) -> None:
        self.log(point_line(record, done, total))
        if self._progress is not None:
            if self._task is None:
                self.start(total)
            self._progress.update(self._task, completed=done, total=total)

    @contextmanager
    def shown(self):
        if not sys.stderr.isatty():
            yield self
            return
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                                   TextColumn, TimeElapsedColumn)

        console = Console(stderr=True)
        if not console.is_interactive:
            yield self
            return
        with Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False),
                      BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                      transient=True, redirect_stdout=False) as progress:
            self._progress = progress
            try:
                yield self
            finally:
                self._progress = self._task = None
