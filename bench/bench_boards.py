"""Board benchmark: real bitstreams of the bundled examples and the MLPerf Tiny models
(``hwonnx.zoo``, calibrated on its plausible random inputs) with the open flow (YoWASP).

Writes ``bench/results/boards.json`` and ``.md``: Fmax against the board clock, DSP, block
RAM and logic use, the program in instructions and bits, predicted cycles and the latency
they give at the board clock and at Fmax, build time. Needs ``pip install -e '.[bitstream]'``;
one build at a time (two at once were 2.5-3x slower each on these machines).
``--streamed``: with the board's external memory, the weight buffer two slots as large as the
largest layer (the most streaming the compiler allows: the LiteDRAM controller is in the
bitstream; rows named ``<model>+<memory>``).
``--array RxC``: that array instead of the board's default (rows keyed by board, model and
array); ``--post-lanes N``: that many requantizers (``ArchConfig.post_lanes``; the row's array
reads ``16x16 (8 post lanes)``). Each row keeps nextpnr's critical path
(``boards/build.critical_path``).
``python bench/bench_boards.py --boards ulx3s-85f --models ic_resnet8 --array 16x16``.
"""

import argparse
import json
import sys
import tempfile
import time
from math import ceil
from pathlib import Path

from results_io import RESULTS, measured_commit, write_results

from hwonnx.api import build
from hwonnx.boards import estimate, get_board
from hwonnx.boards.build import nextpnr_resources
from hwonnx.compiler import instruction_width
from hwonnx.examples import example_path, load_digits_data
from hwonnx.zoo import MLPERF_TINY, random_inputs

SHAPES = {"digits_mlp": (-1, 64), "digits_cnn": (-1, 1, 8, 8)}
MODELS = list(SHAPES) + list(MLPERF_TINY)


def resource_counts(family: str, utilization: dict) -> "dict[str, dict[str, int]]":
    """nextpnr's DSP blocks, block RAMs, LUTs and flip-flops, each used and of the device's
    total (the rows' ``{"used": ..., "total": ...}``)."""
    used = nextpnr_resources(family, utilization)
    totals = nextpnr_resources(family, {c: {"used": u["total"]} for c, u in utilization.items()})
    return {name: {"used": used[name], "total": totals[name]} for name in used}


def _model_and_calib(model: str):
    if model in SHAPES:
        data = load_digits_data()
        return example_path(model), {"image": data["calib"].reshape(SHAPES[model])}
    proto = MLPERF_TINY[model]()
    return proto, random_inputs(proto, 16)


def streaming_options(board, on_chip) -> dict:
    """Build options that stream the most weights from ``board``'s external memory: a weight
    buffer of two slots as large as the largest layer of the on-chip program ``on_chip``, in
    whole block RAMs."""
    block = board.family_info.block_bits // max(board.family_info.block_widths)
    largest = max(layer.wgt_words for layer in on_chip.layers)
    return {"ext_memory": board.ext_memory, "wgt_depth": ceil(2 * largest / block) * block}


def _streaming(board, source, calib) -> dict:
    on_chip = build(source, None, board=board.name, calib=calib, log=lambda message: None)
    return streaming_options(board, on_chip.program)


def measure(board_name: str, model: str, streamed: bool = False,
            array: "tuple[int, int] | None" = None, clock_hz: "int | None" = None,
            post_lanes: "int | None" = None) -> dict:
    board = get_board(board_name)
    source, calib = _model_and_calib(model)
    options = _streaming(board, source, calib) if streamed else {}
    if array:
        options.update(rows=array[0], cols=array[1])
    if clock_hz:
        options.update(clock_hz=clock_hz)
    if post_lanes:
        options.update(post_lanes=post_lanes)
    commit = measured_commit()      # the tree the design is read from, before the long build
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        result = build(source, tmp, board=board_name, verilog=False, bitstream=True,
                       calib=calib, log=lambda message: print(message, flush=True), **options)
        seconds = time.monotonic() - started
    report = result.report["bitstream"]
    used = resource_counts(board.family, report["utilization"])
    predicted = estimate(result.program.config, board)
    config = result.program.config
    cycles = result.report["total"]["predicted_cycles"]
    if streamed:
        model = f"{model}+{board.ext_memory}"
    array_name = config.name + (f" ({config.post_lanes} post lanes)"
                                 if config.post_passes > 1 else "")
    return {"board": board_name, "model": model, "array": array_name,
            "depths": {b: getattr(config, f"{b}_depth") for b in ("act", "wgt", "par", "prog",
                                                                   "acc")},
            "instructions": len(result.program.instructions),
            "program_bits": len(result.program.instructions) * instruction_width(),
            "predicted_cycles": cycles,
            "latency_ms_at_target": round(cycles / (report["target_mhz"] * 1e3), 3),
            "latency_ms_at_fmax": round(cycles / (report["fmax_mhz"] * 1e3), 3)
            if report["fmax_mhz"] else None,
            "fmax_mhz": report["fmax_mhz"], "target_mhz": report["target_mhz"],
            "dsp": used["dsp"], "bram": used["bram"], "luts": used["luts"], "ffs": used["ffs"],
            "fit_check_estimate": {"dsp": predicted.dsp, "bram": predicted.bram_blocks,
                                   "luts": predicted.luts},
            "build_seconds": round(seconds, 1), "toolchain_seconds": report["seconds"],
            "commit": commit, "critical_path": report.get("critical_path"),
            **({"controller_clocks": {n: c for n, c in report["clocks"].items()
                                      if n.startswith("dram.")}} if streamed else {})}


#: Published latencies of the same MLPerf Tiny reference models on FPGAs (MLPerf Tiny v1.1,
#: closed division: fpgaConvNet on a ZedBoard, Zynq XC7Z020; VWW also ANPU on a VCU128; AD:
#: hls4ml's reduced autoencoder on a Pynq-Z2), and the goals of issue #40 for the ULX3S-85F,
#: in ms.
ANCHORS = {"ic_resnet8": ("fpgaConvNet, ZedBoard", 0.411, 0.40),
           "kws_dscnn": ("fpgaConvNet, ZedBoard", 0.324, 0.15),
           "vww_mobilenet": ("fpgaConvNet, ZedBoard (ANPU, VCU128: 0.209)", 9.49, 0.50),
           "ad_autoencoder": ("hls4ml, Pynq-Z2 (a smaller model)", 0.0187, 0.05)}


def anchors(results) -> "list[str]":
    """The published anchors beside the ULX3S-85F rows of the same models."""
    lines = ["", "Published FPGA results for the same models, beside the ULX3S-85F's (each array "
             "measured):", "",
             "| model | published | ms | ulx3s-85f array | ms at Fmax | goal ms | met |",
             "|---|---|---:|---|---:|---:|---|"]
    for r in results:
        if r["board"] == "ulx3s-85f" and r["model"] in ANCHORS and r.get("latency_ms_at_fmax"):
            source, ms, goal = ANCHORS[r["model"]]
            ours = r["latency_ms_at_fmax"]
            lines.append(f"| {r['model']} | {source} | {ms} | {r['array']} | {ours} | {goal} | "
                         f"{'yes' if ours <= goal else 'no'} |")
    return lines


def critical_paths(results) -> "list[str]":
    """nextpnr's critical path of each row that kept it."""
    kept = [r for r in results if r.get("critical_path")]
    if not kept:
        return []
    lines = ["", "Critical paths (nextpnr, post-route; the HDL lines its cells were made from):",
             ""]
    for r in kept:
        path = r["critical_path"]
        lines.append(f"- {r['board']} {r['model']} {r['array']} ({r['fmax_mhz']} MHz): "
                     f"{path['ns']} ns, {path['routing_ns']} of it routing, `{path['from']}` -> "
                     f"`{path['to']}`" + (f" ({', '.join(path['hdl'])})" if path["hdl"] else ""))
    return lines


def markdown(results) -> str:
    lines = ["# Board benchmark", "", "Generated by `python bench/bench_boards.py` (open flow: "
             "YoWASP Yosys + nextpnr from PyPI). Fmax is nextpnr's post-route figure; the "
             "fit-check columns are hwonnx's estimate made before synthesis. Latency is the "
             "predicted cycles (equal to the simulated ones) at the board's clock and at "
             "Fmax. Rows without a program size were measured before the looped ISA and its "
             "tile walker; rows without a commit before the pipelined datapath of #40. Rows "
             "`<model>+<memory>` (`--streamed`) stream the weights from "
             "the board's external memory (`ulx3s-sdram`, `ecpix5-ddr3`) through a weight "
             "buffer of two slots as large as the largest layer, with LiteDRAM's controller "
             "in the bitstream; their cycles are predicted with the memory's model (not yet "
             "measured on a board). Fmax is the accelerator's clock; the DDR3 controller runs "
             "in its own clock domain (its clocks below the table).", "",
             "| board | model | array | Fmax MHz | target MHz | DSP | block RAM | LUTs | FFs | "
             "estimate DSP / BRAM / LUT | instructions (bits) | cycles | ms at target / "
             "Fmax | build s | commit |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---|"]
    for r in results:
        e = r["fit_check_estimate"]
        program = (f"{r['instructions']} ({r['program_bits']:,})" if "instructions" in r
                   else "")
        latency = (f"{r['latency_ms_at_target']} / {r['latency_ms_at_fmax']}"
                   if "predicted_cycles" in r else "")
        lines.append(f"| {r['board']} | {r['model']} | {r['array']} | {r['fmax_mhz']} | "
                     f"{r['target_mhz']} | {r['dsp']['used']}/{r['dsp']['total']} | "
                     f"{r['bram']['used']}/{r['bram']['total']} | "
                     f"{r['luts']['used']}/{r['luts']['total']} | {r['ffs']['used']} | "
                     f"{e['dsp']} / {e['bram']} / {e['luts']} | {program} | "
                     f"{r.get('predicted_cycles', '')} | {latency} | {r['build_seconds']} | "
                     f"{r.get('commit', '')} |")
    clocked = [r for r in results if r.get("controller_clocks")]
    if clocked:
        lines += ["", "The memory controllers' own clocks (nextpnr, post-route):", ""]
        lines += [f"- {r['board']} {r['model']}: " + ", ".join(
            f"`{name}` {c['fmax_mhz']} MHz (needs {c['target_mhz']})"
            for name, c in r["controller_clocks"].items()) + (f"; {r['note']}" if r.get("note")
                                                               else "") for r in clocked]
    return "\n".join(lines + anchors(results) + critical_paths(results)) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--boards", nargs="*", default=["icebreaker", "ulx3s-85f"])
    parser.add_argument("--models", nargs="*", default=list(SHAPES), choices=MODELS)
    parser.add_argument("--streamed", action="store_true",
                        help="stream the weights from the board's external memory")
    parser.add_argument("--array", help="RxC: this array instead of the board's default")
    parser.add_argument("--post-lanes", type=int, metavar="N",
                        help="the post-processor's requantizers (build --post-lanes)")
    parser.add_argument("--clock", type=float, metavar="MHZ",
                        help="the accelerator's clock through the board's PLL (build --clock)")
    args = parser.parse_args(argv)
    array = tuple(int(n) for n in args.array.split("x")) if args.array else None
    previous = args.out / "boards.json"      # keep the rows of boards not measured this time
    results = []
    for board in args.boards:
        for model in args.models:       # written after each build: a long run keeps its rows
            row = measure(board, model, args.streamed, array,
                          round(args.clock * 1e6) if args.clock else None, args.post_lanes)
            results = json.loads(previous.read_text()) if previous.exists() else []
            key = (board, row["model"], row["array"])
            results = [r for r in results if (r["board"], r["model"], r["array"]) != key]
            results.append(row)
            write_results(args.out, "boards", results, markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
