"""The ``hwonnx`` command line: a thin shell over :mod:`hwonnx.api`."""

import argparse
import contextlib
import logging
import math
import os
import re
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .errors import HwonnxError, UsageError

__all__ = ["main", "build_parser"]


def _shape_arg(text: str) -> "tuple[str, tuple[int, ...]]":
    match = re.fullmatch(r"([^=]+)=(\d+(?:x\d+)*)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected NAME=AxBxC, not {text!r}")
    return match.group(1), tuple(int(d) for d in match.group(2).split("x"))


def _seconds_arg(text: str) -> float:
    """A positive, finite number of seconds: ``nan`` (which compares false with everything),
    ``inf``, zero and negative numbers are refused."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive, finite number of seconds, "
                                         f"not {text!r}")
    return value


def _megahertz_arg(text: str) -> int:
    """A clock in MHz, positive and finite, as whole hertz."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value < 1e6):
        raise argparse.ArgumentTypeError(f"expected a clock in MHz, not {text!r}")
    return round(value * 1e6)


def _count_arg(text: str) -> int:
    """A whole number from 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number from 0, not {text!r}")
    return value


def _calibrate_arg(parser: argparse.ArgumentParser) -> None:
    from .quant.calibrate import DEFAULT_METHOD, METHODS
    parser.add_argument("--calibrate", choices=METHODS, default=DEFAULT_METHOD,
                        help="how the calibration samples give each activation's int8 range: "
                             "minmax, onnxruntime's percentile (99.999) or entropy, or the "
                             "range of smallest quantization error (mse) (default: "
                             "%(default)s)")


def build_parser() -> argparse.ArgumentParser:
    from .boards import BOARDS
    from .memories import MEMORIES

    parser = argparse.ArgumentParser(
        prog="hwonnx", description="Compile ONNX models into int8 systolic-array accelerators "
                                   "and prove them bit-exact in cycle-accurate simulation.")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("build", help="compile a model: Verilog, program, images, report")
    p.add_argument("model", type=Path, help="the .onnx model, or the name of a bundled "
                   "example (digits_mlp, digits_cnn: its calibration data is bundled too)")
    p.add_argument("--board", default="sim", choices=sorted(BOARDS),
                   help="target board (default: %(default)s)")
    p.add_argument("-o", "--out", type=Path, required=True, help="build folder to write")
    p.add_argument("--calib", type=Path,
                   help="calibration samples: .npz keyed by input name, .npy (one input) or a "
                        "folder of .npy files; first axis = samples")
    _calibrate_arg(p)
    p.add_argument("--bitstream", action="store_true",
                   help="also build the bitstream (iCE40, ECP5, Gowin: with the YoWASP "
                        "tools)")
    p.add_argument("--rows", type=int, help="array rows (default: the board's)")
    p.add_argument("--cols", type=int, help="array columns (default: the board's)")
    for buffer in ("act", "wgt", "acc", "par", "prog"):
        p.add_argument(f"--{buffer}-depth", type=int, metavar="WORDS",
                       help=f"{buffer} buffer depth (default: the board's)")
    for end in ("in", "out"):
        p.add_argument(f"--stage-{end}-depth", type=int, metavar="WORDS",
                       help=f"words of the {end}put staging buffer through which the tensors "
                            f"in the external memory move (default: sized to the model)")
    p.add_argument("--lut-tables", type=int, metavar="N",
                   help="activation tables (LeakyRelu, Sigmoid, ...) the array holds, 0-63 "
                        "(default: the board's)")
    p.add_argument("--ext-memory", choices=sorted(MEMORIES),
                   help="an external memory the weights that do not fit the weight buffer "
                        "stream from: the board's own (its controller is built in), or any "
                        "for --board sim (simulated with its timing)")
    p.add_argument("--input-shape", type=_shape_arg, action="append", default=[],
                   metavar="NAME=AxBxC", help="bind an input's symbolic dimensions")
    p.add_argument("--override-initializer", action="append", default=[],
                   metavar="NAME=file.npy",
                   help="use this value for an initializer that is also a graph input")
    p.add_argument("--baud", type=int,
                   help="the board's UART rate (default 115200; a faster one loads an "
                        "external memory sooner: 1000000 at 25 MHz)")
    p.add_argument("--clock", type=_megahertz_arg, metavar="MHZ",
                   help="run the accelerator at this clock through the board's PLL (ECP5: "
                        "the fastest it makes of at most MHZ; default: the board's clock, "
                        "'hwonnx boards')")

    p = commands.add_parser("inspect", help="show what the frontend reads from a model, where "
                                            "each node runs, MACs and predicted cycles")
    p.add_argument("model", type=Path, help="the .onnx model, or the name of a bundled "
                   "example (digits_mlp, digits_cnn)")
    p.add_argument("--board", default="sim", choices=sorted(BOARDS),
                   help="target whose default array the prediction uses (default: %(default)s)")
    p.add_argument("--rows", type=int, help="array rows (default: the board's)")
    p.add_argument("--cols", type=int, help="array columns (default: the board's)")
    p.add_argument("--input-shape", type=_shape_arg, action="append", default=[],
                   metavar="NAME=AxBxC", help="bind an input's symbolic dimensions")
    p.add_argument("--override-initializer", action="append", default=[],
                   metavar="NAME=file.npy",
                   help="use this value for an initializer that is also a graph input")
    p.add_argument("--plot", type=Path, metavar="OUT.png",
                   help="also write the chart of where each layer's cycles go (a build's "
                        "report.png) to this file")
    p.add_argument("--calib", type=Path,
                   help="calibration samples (as for build): also compare the calibration "
                        "methods' output error and suggest the smallest's --calibrate")

    p = commands.add_parser("sim", help="run a build on inputs (RTL on Verilator by default)")
    p.add_argument("out", type=Path, help="a build folder written by 'hwonnx build'")
    p.add_argument("--input", type=Path, required=True,
                   help="input samples, same format as --calib")
    p.add_argument("--output", type=Path, help="write outputs to this .npz")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--golden", action="store_true", help="evaluate the golden model instead")
    mode.add_argument("--compare", action="store_true",
                      help="run RTL and golden; fail on any difference in outputs or in "
                           "cycles against the prediction")
    p.add_argument("--max-cycles", type=int, metavar="N",
                   help="stop a sample that runs longer than N cycles on the RTL and show "
                        "the accelerator's state (default: twice the predicted cycles plus "
                        "10,000)")
    p.add_argument("--trace", type=Path, metavar="OUT.vcd|OUT.fst",
                   help="dump the waveforms of the RTL run (every input sample: trace a few) "
                        "into this file, VCD or FST by its suffix, with a GTKWave save file "
                        "OUT.gtkw that groups the signals by engine and marks each layer")

    p = commands.add_parser("demo", help="build and simulate the bundled trained examples")
    p.add_argument("--model", default="all", choices=["all", "digits_mlp", "digits_cnn"])
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--cols", type=int, default=None)
    p.add_argument("-o", "--out", type=Path, default=Path("hwonnx-demo"),
                   help="folder for the build outputs (default: %(default)s)")
    p.add_argument("--samples", type=_count_arg, default=0,
                   help="test samples to simulate (default: all)")

    p = commands.add_parser("run", help="run inputs on a board programmed with a build")
    p.add_argument("out", type=Path, help="a folder written by 'hwonnx build --board B'")
    p.add_argument("--port", required=True, help="serial port of the board, e.g. /dev/ttyUSB0")
    p.add_argument("--input", type=Path, required=True, help="input samples (as for sim)")
    p.add_argument("--output", type=Path, help="write outputs to this .npz")
    p.add_argument("--baud", type=int, help="UART baud rate (default: the build's)")

    p = commands.add_parser("bitstream", help="build the bitstream of a board build folder")
    p.add_argument("out", type=Path, help="a folder written by 'hwonnx build --board B'")

    p = commands.add_parser("explore", help="sweep array sizes of a model on a board (on "
                                            "Dask): cycles, fit, latency, Pareto front")
    p.add_argument("model", type=Path, help="the .onnx model, or the name of a bundled "
                   "example (digits_mlp, digits_cnn: its calibration data is bundled too)")
    p.add_argument("--board", required=True, choices=sorted(BOARDS), help="target board")
    p.add_argument("--calib", type=Path, help="calibration samples (as for build)")
    _calibrate_arg(p)
    p.add_argument("--rows", default="4..16", metavar="SIZES",
                   help="array rows to try: a list (4,8,12) and ranges of powers of two "
                        "(4..16: 4, 8, 16) (default: %(default)s)")
    p.add_argument("--cols", default="4..16", metavar="SIZES",
                   help="array columns to try, as --rows (default: %(default)s)")
    p.add_argument("--depths", default="auto", metavar="auto|BUF=WORDS,...",
                   help="buffer depths: auto sizes them to the model (as build does); "
                        "act=4096,wgt=2048 fixes those for every point (default: auto)")
    p.add_argument("--bitstream", action="store_true",
                   help="build each point's bitstream: Fmax and resources from nextpnr "
                        "(minutes to an hour per point)")
    p.add_argument("--sim", type=int, default=0, metavar="N",
                   help="run N samples per point on the RTL and check them against the "
                        "golden model (a Verilator build per point)")
    p.add_argument("--input", type=Path,
                   help="samples for --sim (default: the calibration samples)")
    p.add_argument("-o", "--out", type=Path, default=Path("explore"),
                   help="folder for explore.json/.md/.png and the points (default: "
                        "%(default)s)")
    p.add_argument("--resume", action="store_true",
                   help="keep the points of the folder that finished (ok, does not fit); run "
                        "the others")
    p.add_argument("--timeout", type=_seconds_arg, metavar="SECONDS",
                   help="stop a point after this long (default: 600; 1800 with --sim, 14400 "
                        "with --bitstream)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="send the points to this Dask scheduler (tcp://host:8786) instead of "
                        "a local cluster")
    p.add_argument("--workers", type=int, metavar="N",
                   help="workers of the local cluster (default: one per CPU, at most one per "
                        "point)")
    p.add_argument("--input-shape", type=_shape_arg, action="append", default=[],
                   metavar="NAME=AxBxC", help="bind an input's symbolic dimensions")

    commands.add_parser("boards", help="list the known boards")
    return parser


def _save_outputs(path: Path, outputs: "dict[str, np.ndarray]") -> None:
    """Write ``outputs`` to ``path`` (the name exactly: no added .npz) whole or not at all:
    into a temporary file beside it, renamed over it when complete."""
    partial = None
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "Is a directory")
        handle, partial = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                                           dir=path.parent)
        with os.fdopen(handle, "wb") as stream:
            np.savez(stream, **outputs)
        os.chmod(partial, 0o666 & ~_umask())
        os.replace(partial, path)
        partial = None
    except OSError as error:
        raise UsageError(f"Cannot write outputs to '{path}': "
                         f"{error.strerror or error}") from error
    finally:
        if partial is not None:
            with contextlib.suppress(OSError):
                os.unlink(partial)


def _check_output(path: Path) -> None:
    """Refuse an ``--output`` that cannot be written before anything runs."""
    if path.is_dir():
        raise UsageError(f"Cannot write outputs to '{path}': Is a directory")
    if not path.parent.is_dir():
        why = "Not a directory" if path.parent.exists() else "No such file or directory"
        raise UsageError(f"Cannot write outputs to '{path}': {why}")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _rate(cycles_per_second: float) -> str:
    """``1.2 M``, ``35 k``, ``658``: a simulation speed for people."""
    if cycles_per_second >= 1e6:
        return f"{cycles_per_second / 1e6:.1f} M"
    if cycles_per_second >= 1e4:
        return f"{cycles_per_second / 1e3:.0f} k"
    return f"{cycles_per_second:,.0f}"


#: The step that follows a message, for the spinner: steps the code announces itself end in
#: "..." ("Simulating 450 test images of digits_mlp on the RTL ..."); these are not announced.
_NEXT_STEPS = (
    ("Compiled ", "Generating Verilog ..."),                 # api.build
    ("Built in ", "Simulating on the RTL ..."),              # after the Verilator build
)


class _Output:
    """Where the commands' messages go: stderr, one line each (stdout holds the results).
    On a terminal, :meth:`steps` also shows the running step under the lines, with a spinner
    and its time: a message ending in "..." starts a step, and :data:`_NEXT_STEPS` names the
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
            follows = next((step for prefix, step in _NEXT_STEPS if message.startswith(prefix)),
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


class _LogHandler(logging.Handler):
    """Log records as :class:`_Output` lines, so that they print above the spinner."""

    def __init__(self, output: _Output, level: int) -> None:
        super().__init__(level)
        self.output = output

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.output.line(self.format(record))
        except Exception:
            self.handleError(record)


def _model_path(model: Path) -> "tuple[Path, str | None]":
    """The model file of the ``model`` argument, and the bundled example it names (None for a
    file): a bundled example's name (``digits_mlp``) stands for its file, unless a file of
    that name exists."""
    from .examples import EXAMPLES, example_path

    if not model.exists() and str(model) in EXAMPLES:
        return example_path(str(model)), str(model)
    return model, None


def _table(header: "list[str]", rows: "list[list[str]]", right: "set[int]") -> str:
    """A plain-text table whose columns are as wide as their longest cell; columns
    ``right`` are right-aligned, the last column is not padded."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
                     for row in [header, *rows])


def _run(args, output: _Output) -> int:
    from . import api

    log = output.log
    if args.command == "build":
        depths = {f"{b}_depth": getattr(args, f"{b}_depth")
                  for b in ("act", "wgt", "acc", "par", "prog", "stage_in", "stage_out")}
        depths["lut_tables"] = args.lut_tables
        from .examples import example_calibration
        from .frontend import read_overrides
        model, example = _model_path(args.model)
        calib = args.calib
        if calib is None and example:                   # its calibration data is bundled
            calib = example_calibration(example)
        with output.steps(f"Reading and compiling {model.name} ..."):
            api.build(model, args.out, board=args.board, calib=calib, rows=args.rows,
                      cols=args.cols, input_shapes=dict(args.input_shape) or None, log=log,
                      override_initializers=read_overrides(args.override_initializer) or None,
                      bitstream=args.bitstream, ext_memory=args.ext_memory, baud=args.baud,
                      clock_hz=args.clock,
                      calibrate=args.calibrate,
                      **{k: v for k, v in depths.items() if v is not None})
    elif args.command == "inspect":
        from .boards import get_board
        from .frontend import read_overrides
        from .inspect import (check_plot_path, format_calibration, format_inspection,
                              format_placement, load_for_inspection)
        from .quant import load_samples
        model, _ = _model_path(args.model)
        if args.plot:
            check_plot_path(args.plot)          # before the model is read
        config = api.configure_arch(get_board(args.board).default_config, rows=args.rows,
                                    cols=args.cols)
        shapes = dict(args.input_shape) or None
        overrides = read_overrides(args.override_initializer) or None
        with output.steps(f"Reading {model.name} ..."):
            graph = load_for_inspection(model, shapes, overrides)
        # read before anything is printed: a file that does not fit is refused first
        samples = None if args.calib is None else load_samples(args.calib, graph,
                                                                "Calibration file")
        print(format_inspection(graph, str(model)))
        with output.steps(f"Placing {model.name} on the {config.name} array ..."):
            placement = format_placement(graph, config, size=args.board, plot=args.plot,
                                         model=str(model))
        print(f"\n{placement}")
        if samples is not None:
            with output.steps("Comparing the calibration methods ..."):
                comparison = format_calibration(graph, samples)
            print(f"\n{comparison}")
        if args.plot:
            print(f"\nChart written to {args.plot}")
    elif args.command == "sim":
        if args.output:
            _check_output(args.output)          # before a simulation that may take long
        mode = "golden" if args.golden else "compare" if args.compare else "rtl"
        first = {"rtl": "Simulating on the RTL ...", "golden": "Running the golden model ...",
                 "compare": "Simulating on the RTL, then on the golden model ..."}[mode]
        with output.steps(first):
            result = api.simulate(args.out, args.input, mode=mode, max_cycles=args.max_cycles,
                                  log=log, trace=args.trace)
        count = len(next(iter(result.outputs.values())))
        if result.cycles:
            print(f"{count} sample(s) on RTL: {int(np.mean(result.cycles)):,} cycles per sample "
                  f"(predicted {result.predicted_cycles:,}), utilization "
                  f"{result.utilization:.1%}, {_rate(result.steady_cycles_per_second)} "
                  f"cycles/s simulated (excluding {result.startup_seconds:.1f} s start-up)")
            for index, cycles in enumerate(result.segment_cycles):
                print(f"  segment {index + 1}: {int(np.mean(cycles)):,} cycles per sample "
                      f"(predicted {result.segment_predicted[index]:,})")
        else:
            print(f"{count} sample(s) on the golden model (predicted "
                  f"{result.predicted_cycles:,} cycles per sample)")
            for index, predicted in enumerate(result.segment_predicted):
                print(f"  segment {index + 1}: predicted {predicted:,} cycles per sample")
        if mode == "compare":
            print("RTL equals the golden model bit for bit")
        if args.trace:
            print(f"Trace written to {args.trace}; view it with: gtkwave "
                  f"{args.trace.with_suffix('.gtkw')}")
        if args.output:
            _save_outputs(args.output, result.outputs)
            print(f"Outputs written to {args.output}")
    elif args.command == "demo":
        from .demo import demo_runs, format_demo
        with output.steps():
            runs = demo_runs(args.model, args.out, rows=args.rows, cols=args.cols,
                             samples=args.samples, log=log)
        print(format_demo(runs))
    elif args.command == "run":
        if args.output:
            _check_output(args.output)
        with output.steps(f"Running on the board on {args.port} ..."):
            result = api.run_board(args.out, args.port, args.input, baud=args.baud, log=log)
        count = len(next(iter(result.outputs.values())))
        print(f"{count} sample(s) on the board: {int(np.mean(result.cycles)):,} cycles per "
              f"sample (predicted {result.predicted_cycles:,})")
        if args.output:
            _save_outputs(args.output, result.outputs)
            print(f"Outputs written to {args.output}")
    elif args.command == "bitstream":
        with output.steps():
            api.bitstream(args.out, log=log)
    elif args.command == "explore":
        from .examples import example_calibration
        from .explore import explore, parse_sizes
        from .explore.outputs import text_summary
        from .explore.progress import SweepProgress
        model, example = _model_path(args.model)
        calib = args.calib
        if calib is None and example:                   # its calibration data is bundled
            calib = example_calibration(example)
        if args.workers is not None and args.workers < 1:
            raise UsageError(f"--workers takes a positive number, not {args.workers}")
        progress = SweepProgress()
        with progress.shown():
            summary = explore(
                model, args.board, rows=parse_sizes(args.rows, "--rows"),
                cols=parse_sizes(args.cols, "--cols"), calib=calib, depths=args.depths,
                input_shapes=dict(args.input_shape) or None, bitstream=args.bitstream,
                sim=args.sim, inputs=args.input, out_dir=args.out, scheduler=args.scheduler,
                workers=args.workers, timeout=args.timeout, resume=args.resume,
                calibrate=args.calibrate,
                model_label=str(args.model), calib_label=str(args.calib) if args.calib else None,
                log=progress.log, on_start=progress.start, on_point=progress.point)
        print(text_summary(summary, args.out))
        if not summary["counts"].get("ok"):         # nothing to recommend: not a success
            from .errors import SweepError
            said = {"does-not-fit": "do not fit", "failed": "failed", "timeout": "timed out"}
            counts = ", ".join(f"{n} {said[status]}" for status, n
                               in summary["counts"].items() if n)
            raise SweepError(f"No point of the sweep succeeded ({counts}); "
                             f"{Path(args.out) / 'explore.md'} gives each point's reason")
    elif args.command == "boards":
        from .boards import BOARDS
        rows = []
        for board in BOARDS.values():
            cfg = board.default_config
            flow = ("simulation" if board.is_simulation else "YoWASP (PyPI)"
                    if board.family_info.open_flow else board.family_info.toolchain)
            rows.append([board.name, f"{cfg.rows}x{cfg.cols}", f"{board.clock_hz / 1e6:.0f}MHz",
                         str(board.dsp), str(board.bram_kbits), str(board.luts), flow,
                         board.description])
        print(_table(["board", "array", "clock", "DSP", "BRAM kb", "LUTs", "bitstream",
                      "description"], rows, right={1, 2, 3, 4, 5}))
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    output = _Output()
    # Tool chatter (cocotb's runner logs each command at INFO) shows only with -v.
    level = max(logging.DEBUG, logging.WARNING - 10 * args.verbose)
    handler = _LogHandler(output, level)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    try:
        return _run(args, output)
    except HwonnxError as error:
        print(f"hwonnx: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:   # what was being written is removed on the way out
        print("hwonnx: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:     # the reader went away (hwonnx inspect m.onnx | head): stop
        # quietly, and keep Python from failing again when it flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141              # as a shell reports a process ended by SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
