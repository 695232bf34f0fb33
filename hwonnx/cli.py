"""The ``hwonnx`` command line: a thin shell over :mod:`hwonnx.api`."""

import argparse
import logging
import re
import sys
from pathlib import Path

import numpy as np

from .errors import HwonnxError, UsageError

__all__ = ["main", "build_parser"]


def _shape_arg(text: str) -> "tuple[str, tuple[int, ...]]":
    match = re.fullmatch(r"([^=]+)=(\d+(?:x\d+)*)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected NAME=AxBxC, not {text!r}")
    return match.group(1), tuple(int(d) for d in match.group(2).split("x"))


def build_parser() -> argparse.ArgumentParser:
    from .boards import BOARDS

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
    p.add_argument("--bitstream", action="store_true",
                   help="also build the bitstream (iCE40/ECP5, with the YoWASP tools)")
    p.add_argument("--rows", type=int, help="array rows (default: the board's)")
    p.add_argument("--cols", type=int, help="array columns (default: the board's)")
    for buffer in ("act", "wgt", "acc", "par", "prog"):
        p.add_argument(f"--{buffer}-depth", type=int, metavar="WORDS",
                       help=f"{buffer} buffer depth (default: the board's)")
    p.add_argument("--lut-tables", type=int, metavar="N",
                   help="activation tables (LeakyRelu, Sigmoid, ...) the array holds, 0-15 "
                        "(default: the board's)")
    p.add_argument("--input-shape", type=_shape_arg, action="append", default=[],
                   metavar="NAME=AxBxC", help="bind an input's symbolic dimensions")
    p.add_argument("--override-initializer", action="append", default=[],
                   metavar="NAME=file.npy",
                   help="use this value for an initializer that is also a graph input")

    p = commands.add_parser("inspect", help="show what the frontend reads from a model, where "
                                            "each node runs, MACs and predicted cycles")
    p.add_argument("model", type=Path, help="the .onnx model")
    p.add_argument("--board", default="sim", choices=sorted(BOARDS),
                   help="target whose default array the prediction uses (default: %(default)s)")
    p.add_argument("--rows", type=int, help="array rows (default: the board's)")
    p.add_argument("--cols", type=int, help="array columns (default: the board's)")
    p.add_argument("--input-shape", type=_shape_arg, action="append", default=[],
                   metavar="NAME=AxBxC", help="bind an input's symbolic dimensions")
    p.add_argument("--override-initializer", action="append", default=[],
                   metavar="NAME=file.npy",
                   help="use this value for an initializer that is also a graph input")

    p = commands.add_parser("sim", help="run a build on inputs (RTL on Verilator by default)")
    p.add_argument("out", type=Path, help="a build folder written by 'hwonnx build'")
    p.add_argument("--input", type=Path, required=True,
                   help="input samples, same format as --calib")
    p.add_argument("--output", type=Path, help="write outputs to this .npz")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--golden", action="store_true", help="evaluate the golden model instead")
    mode.add_argument("--compare", action="store_true",
                      help="run RTL and golden; fail on any difference")

    p = commands.add_parser("demo", help="build and simulate the bundled trained examples")
    p.add_argument("--model", default="all", choices=["all", "digits_mlp", "digits_cnn"])
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--cols", type=int, default=None)
    p.add_argument("-o", "--out", type=Path, default=Path("hwonnx-demo"),
                   help="folder for the build outputs (default: %(default)s)")
    p.add_argument("--samples", type=int, default=0,
                   help="test samples to simulate (default: all)")

    p = commands.add_parser("run", help="run inputs on a board programmed with a build")
    p.add_argument("out", type=Path, help="a folder written by 'hwonnx build --board B'")
    p.add_argument("--port", required=True, help="serial port of the board, e.g. /dev/ttyUSB0")
    p.add_argument("--input", type=Path, required=True, help="input samples (as for sim)")
    p.add_argument("--output", type=Path, help="write outputs to this .npz")
    p.add_argument("--baud", type=int, help="UART baud rate (default: the build's)")

    p = commands.add_parser("bitstream", help="build the bitstream of a board build folder")
    p.add_argument("out", type=Path, help="a folder written by 'hwonnx build --board B'")

    commands.add_parser("boards", help="list the known boards")
    return parser


def _save_outputs(path: Path, outputs: "dict[str, np.ndarray]") -> None:
    try:
        with open(path, "wb") as stream:        # keeps the name exactly (no added .npz)
            np.savez(stream, **outputs)
    except OSError as error:
        raise UsageError(f"Cannot write outputs to '{path}': {error.strerror}") from error


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _run(args) -> int:
    from . import api

    if args.command == "build":
        depths = {f"{b}_depth": getattr(args, f"{b}_depth")
                  for b in ("act", "wgt", "acc", "par", "prog")}
        depths["lut_tables"] = args.lut_tables
        from .examples import EXAMPLES, example_calibration, example_path
        from .frontend import read_overrides
        model, calib = args.model, args.calib
        if not model.exists() and str(model) in EXAMPLES:      # a bundled example by name
            model, calib = example_path(str(model)), calib or example_calibration(str(model))
        api.build(model, args.out, board=args.board, calib=calib, rows=args.rows,
                  cols=args.cols, input_shapes=dict(args.input_shape) or None, log=_log,
                  override_initializers=read_overrides(args.override_initializer) or None,
                  bitstream=args.bitstream,
                  **{k: v for k, v in depths.items() if v is not None})
    elif args.command == "inspect":
        from .frontend import read_overrides
        from .inspect import inspect_model
        shapes = dict(args.input_shape) or None
        overrides = read_overrides(args.override_initializer) or None
        print(inspect_model(args.model, shapes, overrides))
        from dataclasses import replace

        from .boards import get_board
        from .report import placement_table
        config = get_board(args.board).default_config
        config = replace(config, rows=args.rows or config.rows, cols=args.cols or config.cols)
        graph, program = api.plan_model(args.model, config=config, input_shapes=shapes,
                                        override_initializers=overrides)
        from .compiler.timing import predict
        total = predict(program.instructions, config).total
        utilization = program.macs / (total * config.rows * config.cols)
        print(f"\nPlacement on a {config.name} array ({program.macs:,} MACs, {total:,} "
              f"predicted cycles per inference, {utilization:.1%} utilization):")
        print(placement_table(graph, program))
    elif args.command == "sim":
        mode = "golden" if args.golden else "compare" if args.compare else "rtl"
        result = api.simulate(args.out, args.input, mode=mode, log=_log)
        count = len(next(iter(result.outputs.values())))
        if result.cycles:
            print(f"{count} sample(s) on RTL: {int(np.mean(result.cycles)):,} cycles per sample "
                  f"(predicted {result.predicted_cycles:,}), utilization "
                  f"{result.utilization:.1%}, {result.cycles_per_second:,.0f} cycles/s")
        else:
            print(f"{count} sample(s) on the golden model (predicted "
                  f"{result.predicted_cycles:,} cycles per sample)")
        if mode == "compare":
            print("RTL equals the golden model bit for bit")
        if args.output:
            _save_outputs(args.output, result.outputs)
            print(f"Outputs written to {args.output}")
    elif args.command == "demo":
        from .demo import run_demo
        return run_demo(args.model, args.out, rows=args.rows, cols=args.cols,
                        samples=args.samples, log=_log)
    elif args.command == "run":
        result = api.run_board(args.out, args.port, args.input, baud=args.baud, log=_log)
        count = len(next(iter(result.outputs.values())))
        print(f"{count} sample(s) on the board: {int(np.mean(result.cycles)):,} cycles per "
              f"sample (predicted {result.predicted_cycles:,})")
        if args.output:
            _save_outputs(args.output, result.outputs)
            print(f"Outputs written to {args.output}")
    elif args.command == "bitstream":
        api.bitstream(args.out, log=_log)
    elif args.command == "boards":
        from .boards import BOARDS
        print(f"{'board':16} {'array':>6} {'clock':>7} {'DSP':>4} {'BRAM kb':>8} {'LUTs':>6}  "
              f"{'bitstream':20} description")
        for board in BOARDS.values():
            cfg = board.default_config
            flow = ("simulation" if board.is_simulation else "YoWASP (PyPI)"
                    if board.family_info.open_flow else board.family_info.toolchain)
            print(f"{board.name:16} {cfg.rows:>2}x{cfg.cols:<3} {board.clock_hz / 1e6:5.0f}MHz "
                  f"{board.dsp:4} {board.bram_kbits:8} {board.luts:6}  {flow:20} "
                  f"{board.description}")
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * args.verbose,
                        format="%(name)s: %(message)s")
    try:
        return _run(args)
    except HwonnxError as error:
        print(f"hwonnx: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
