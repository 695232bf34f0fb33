"""The ``hwonnx`` command line: a thin shell over :mod:`hwonnx.api` (its arguments in
:mod:`.cli_parser`, its messages on the terminal in :mod:`.cli_output`)."""

import contextlib
import logging
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from .cli_output import LogHandler, Output
from .cli_parser import build_parser
from .errors import HwonnxError, UsageError

__all__ = ["main", "build_parser"]


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


def _run(args, output: Output) -> int:
    from . import api

    log = output.log
    if args.command == "build":
        depths = {f"{b}_depth": getattr(args, f"{b}_depth")
                  for b in ("act", "wgt", "acc", "par", "prog", "stage_in", "stage_out")}
        depths["lut_tables"] = args.lut_tables
        depths["post_lanes"] = args.post_lanes
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
    output = Output()
    # Tool chatter (cocotb's runner logs each command at INFO) shows only with -v.
    level = max(logging.DEBUG, logging.WARNING - 10 * args.verbose)
    handler = LogHandler(output, level)
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
