"""The ``hwonnx`` command line's arguments: :func:`build_parser`, one sub-command each
(``build``, ``inspect``, ``sim``, ``demo``, ``run``, ``bitstream``, ``explore``, ``boards``),
with the checks of argument values that argparse reports as usage errors."""

import argparse
import math
import re
from pathlib import Path

__all__ = ["build_parser"]


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
    p.add_argument("--post-lanes", type=int, metavar="N",
                   help="requantizers of the post-processor, a divisor of the columns: each "
                        "serves cols/N columns, one per cycle, and leaves its multipliers to "
                        "the array (default: the board's, one per column)")
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
