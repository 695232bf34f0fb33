"""Where the ``hwonnx`` commands' messages go: stderr, one line each (stdout holds the
results), with the running step and a spinner under the lines on a terminal; log records
(tool chatter with ``-v``) as lines of the same kind."""

import logging
import sys
from contextlib import contextmanager

__all__ = ["Output", "LogHandler"]


#: The step that follows a message, for the spinner: steps the code announces itself end in
#: "..." ("Simulating 450 test images of digits_mlp on the RTL ..."); these are not announced.
NEXT_STEPS = (
    ("Compiled ", "Generating Verilog ..."),                 # api.build
    ("Built in ", "Simulating on the RTL ..."),              # after the Verilator build
)


class Output:
    """Where the commands' messages go: stderr, one line each (stdout holds the results).
    On a terminal, :meth:`steps` also shows the running step under the lines, with a spinner
    and its time: a message ending in "..." starts a step, and :data:`NEXT_STEPS` names the
    steps that the code does not announce."""

    def __init__(self) -> None:
        self._progress = None
        self._task = None

    def line(self, text: str) -> None:
        if self._progress is None:
            print(text, file=sys.stderr, flush=True)
        else:
            self._progress.console.print(text, markup=False, highlight=False, emoji=False,
                                         soft_wrap=True)

    def log(self, message: str) -> None:
        """The ``log`` callback of :mod:`hwonnx.api`."""
        self.line(message)
        if self._progress is not None:
            follows = next((step for prefix, step in NEXT_STEPS if message.startswith(prefix)),
                           None)
            if message.endswith("...") or follows:
                self._step(follows or message)

    @contextmanager
    def steps(self, first: "str | None" = None):
        """Show the running step (``first``, then the announced ones) while the body runs,
        if stderr is a terminal; elsewhere (CI, tests, a file) only the lines."""
        if not sys.stderr.isatty():
            yield
            return
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        if not console.is_interactive:          # TERM=dumb, TTY_INTERACTIVE=0
            yield
            return
        with Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False),
                      TimeElapsedColumn(), console=console, transient=True,
                      redirect_stdout=False) as progress:
            self._progress = progress
            try:
                if first:
                    self._step(first)
                yield
            finally:
                self._progress = self._task = None

    def _step(self, text: str) -> None:
        if self._task is not None:
            self._progress.remove_task(self._task)
        self._task = self._progress.add_task(text, total=None)


class LogHandler(logging.Handler):
    """Log records as :class:`Output` lines, so that they print above the spinner."""

    def __init__(self, output: Output, level: int) -> None:
        super().__init__(level)
        self.output = output

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.output.line(self.format(record))
        except Exception:
            self.handleError(record)
