"""ImageNet-class models on the ULX3S-85F with its SDRAM (issue 16): ResNet-18, MobileNetV2, the
YOLO-style detector and the U-Net of :mod:`hwonnx.zoo.imagenet` (seeded weights), each sized by
the board build (``hwonnx build --board ulx3s-85f --ext-memory ulx3s-sdram``), checked against
the board's block RAM, and run on the Verilator RTL with the SDRAM's deterministic memory model:
bit-exact with golden, simulated cycles = predicted.

Writes ``bench/results/imagenet.json`` and ``.md``: cycles (predicted and simulated), external
bytes per inference (streamed weights, activations moved in and out, program pages), the share
of the cycles bound by the memory (the cycles beyond what the same program takes with a memory
that delivers a word every cycle), and latency at the board's 25 MHz and, with
``--bitstream``, at the Fmax of the model's own bitstream (Yosys + nextpnr-ecp5, LiteDRAM's
controller in it; minutes to an hour each). Tensil's published figures stand beside them.
``python bench/bench_imagenet.py [--models ...] [--bitstream] [--resume]``.
"""

import argparse
import json
import sys
import tempfile
import time
from math import prod
from dataclasses import replace
from pathlib import Path

from bench_extmem import TENSIL
from results_io import RESULTS, measured_commit, write_results

from hwonnx.api import build, compile_model, simulate
from hwonnx.boards import check_board_fit, estimate, get_board
from hwonnx.boards.build import nextpnr_resources
from hwonnx.compiler.paging import pages_words
from hwonnx.compiler.timing import predict
from hwonnx.errors import ResourceError
from hwonnx.fitting import configure_arch
from hwonnx.isa import Op
from hwonnx.zoo import random_inputs
from hwonnx.zoo.imagenet import IMAGENET

BOARD = "ulx3s-85f"

#: Simulated cycles of each model when activation transfers ran alone (no engine beside a
#: LOADA or STOREA; bench/results/imagenet.json at commit c390aa6), for the comparison.
ALONE = {"resnet18": 44_372_700, "mobilenet_v2": 15_817_486, "yolo_tiny": 11_070_141,
         "unet_tiny": 76_429_000}


def quiet(message):
    pass


def traffic(program) -> dict:
    """External bytes one inference moves: streamed weights (LOADX), activations (LOADA,
    STOREA) and the program's pages (each read once per run)."""
    cfg = program.config
    moved = {"weights": 0, "activations": 0}
    for instr in program.instructions:
        if instr.op == Op.LOADX:
            moved["weights"] += instr["count"] * cfg.cols
        elif instr.op in Op.ACTX:
            moved["activations"] += instr["count"] * cfg.rows
    moved["program"] = pages_words(program) * cfg.cols
    return moved


def sized_build(name: str):
    """The model, its calibration samples, and its program compiled as the board build sizes
    it (as ``tests/zoo/test_zoo_imagenet_slow.py`` does)."""
    model = IMAGENET[name](0)
    calib = random_inputs(model, 4, 0)
    board = get_board(BOARD)
    config = configure_arch(replace(board.default_config, clock_hz=board.clock_hz),
                            board.ext_memory)
    _, sized = compile_model(model, calib, config=config, size=board.name, log=quiet)
    return model, calib, sized


def commit() -> str:
    """The commit the measurement runs at (``+`` when the tree has changes outside
    ``bench/results/``)."""
    return measured_commit("bench/results")


def measure(name: str) -> dict:
    board = get_board(BOARD)
    started = time.monotonic()
    model, calib, sized = sized_build(name)
    inputs = random_inputs(model, 1, 1)
    config = sized.config
    try:
        check_board_fit(sized, board)
        refusal = None
    except ResourceError as error:
        refusal = str(error)
    result = build(model, None, config=config, calib=calib, log=quiet)
    compile_seconds = time.monotonic() - started
    program = result.program
    started = time.monotonic()
    rtl = simulate(result, inputs, mode="compare", log=quiet)    # raises on any difference
    sim_seconds = time.monotonic() - started
    assert list(rtl.cycles) == [rtl.predicted_cycles]
    fast = predict(program.expanded(), config,
                   memory_timing=config.ext_timing.fastest(config.cols)).total
    moved = traffic(program)
    used = estimate(config, board)
    row = {
        "model": name, "parameters": sum(prod(init.dims) for init in model.graph.initializer),
        "macs": rtl.macs, "array": config.name,
        "depths": {b: getattr(config, f"{b}_depth")
                   for b in ("act", "stage_in", "stage_out", "wgt", "par", "prog")},
        "prog_page": config.prog_page, "instructions": len(program.instructions),
        "fits": refusal is None, "refusal": refusal,
        "bram_estimate": used.bram_blocks, "dsp_estimate": used.dsp, "luts_estimate": used.luts,
        "external_bytes": sum(moved.values()), "external_bytes_by_kind": moved,
        "predicted_cycles": rtl.predicted_cycles, "simulated_cycles": int(rtl.cycles[0]),
        "fast_memory_cycles": fast,
        "memory_bound_fraction": round(1 - fast / rtl.predicted_cycles, 4),
        "cycles_transfers_alone": ALONE.get(name),
        "ms_at_25MHz": round(rtl.predicted_cycles / config.clock_hz * 1e3, 2),
        "bit_exact_with_golden": True, "commit": commit(),
        "compile_seconds": round(compile_seconds, 1), "simulation_seconds": round(sim_seconds, 1),
        "simulated_cycles_per_second": round(rtl.steady_cycles_per_second),
    }
    return row


def add_bitstream(row: dict) -> None:
    """Build the bitstream of ``row``'s model (its sized configuration, LiteDRAM's controller
    in it) and add its Fmax, nextpnr's resources and the latency at that Fmax."""
    board = get_board(BOARD)
    model, calib, sized = sized_build(row["model"])
    assert {b: getattr(sized.config, f"{b}_depth") for b in row["depths"]} == row["depths"]
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        built = build(model, tmp, board=BOARD, config=sized.config, calib=calib, verilog=False,
                      bitstream=True, log=lambda message: print(message, flush=True))
        seconds = time.monotonic() - started
    assert built.report["total"]["predicted_cycles"] == row["predicted_cycles"]
    report = built.report["bitstream"]
    row.update(fmax_mhz=report["fmax_mhz"], bitstream_seconds=round(seconds, 1),
               resources=nextpnr_resources(board.family, report["utilization"]),
               ms_at_fmax=round(row["predicted_cycles"] / (report["fmax_mhz"] * 1e3), 2))


def markdown(results) -> str:
    results = list(results)
    lines = [
        "# ImageNet-class models with the external memory", "",
        "Generated by `python bench/bench_imagenet.py`: the models of `hwonnx.zoo.imagenet` "
        "(seeded weights) built for `ulx3s-85f` with `--ext-memory ulx3s-sdram` (8x8 array, "
        "25 MHz; buffers sized by the board build, the program paged from the SDRAM), one "
        "sample each on the Verilator RTL with the SDRAM's deterministic memory model (8 cycles "
        "latency, bursts of 16 words, a 16-bit bus: 4 cycles per 8-byte word, a 4-cycle "
        "refresh every 195 cycles), bit-exact with golden, simulated = predicted cycles. "
        "*Memory-bound* is the share of the cycles beyond what the same program takes with a "
        "memory that delivers a word every cycle (latency 2, no refresh), from the cycle "
        "model. The external bytes are one inference's: streamed weights and their "
        "parameters, activations moved in and out through the staging buffers, and the "
        "program's pages. *Transfers alone*: "
        "the cycles when no engine ran beside a LOADA or STOREA (commit c390aa6, before the "
        "staging buffers, with that commit's buffer depths: the two differ in both). The "
        "board build grows the staging buffers while the design stays within 75% of the "
        "block RAMs (fuller designs were still routing after 25 minutes); a model whose smallest "
        "buffers take more is built at those. Measured at commit "
        + ", ".join(sorted({r.get("commit", "?") for r in results})) + ".", "",
        "| model | parameters | MACs | fits the 85F (block RAMs, estimate) | weight, staging "
        "words (in, out) | instructions | "
        "external MB / inference (weights, activations, program) | cycles predicted "
        "(simulated) | transfers alone | memory-bound | ms at 25 MHz | Fmax | ms at Fmax |",
        "|---|---:|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        mb = {k: v / 1e6 for k, v in r["external_bytes_by_kind"].items()}
        depths = r["depths"]
        fmax = f"{r['fmax_mhz']} MHz" if r.get("fmax_mhz") else "not built"
        lines.append(
            f"| {r['model']} | {r['parameters'] / 1e6:.2f} M | {r['macs'] / 1e9:.3f} G | "
            f"{'yes' if r['fits'] else 'no'} ({r['bram_estimate']} of 208) | "
            f"{depths['wgt']:,}, {depths['stage_in']:,}, {depths['stage_out']:,} | "
            f"{r['instructions']:,} | {r['external_bytes'] / 1e6:.2f} ({mb['weights']:.2f}, "
            f"{mb['activations']:.2f}, {mb['program']:.3f}) | {r['predicted_cycles']:,} "
            f"({r['simulated_cycles']:,}) | {_alone(r)} | {r['memory_bound_fraction']:.1%} | "
            f"{r['ms_at_25MHz']:,} | {fmax} | {r.get('ms_at_fmax', '-')} |")
    built = [r for r in results if r.get("fmax_mhz")]
    if built:
        lines += ["", "Bitstreams (Yosys and nextpnr-ecp5 from YoWASP, LiteDRAM's SDRAM "
                      "controller in them), nextpnr's figures:", ""]
        lines += [f"- **{r['model']}**: Fmax {r['fmax_mhz']} MHz (25 MHz needed), "
                  f"{r['resources']['dsp']} DSP blocks, {r['resources']['bram']} block RAMs, "
                  f"{r['resources']['luts']:,} LUTs" + (f"; {r['bitstream_note']}"
                                                        if r.get("bitstream_note") else
                                                        f"; built in {r['bitstream_seconds']} s")
                  for r in built]
    unbuilt = [r for r in results if r["fits"] and not r.get("fmax_mhz")
               and r.get("bitstream_note")]
    if unbuilt:
        lines += ["", "No bitstream:", ""]
        lines += [f"- **{r['model']}**: {r['bitstream_note']}" for r in unbuilt]
    refused = [r for r in results if not r["fits"]]
    if refused:
        lines += ["", "Refused by the fit check (they run on the RTL all the same):", ""]
        lines += [f"- **{r['model']}**: {r['refusal']}" for r in refused]
    lines += ["", "Tensil's published figures, on other boards (both larger and faster than "
                  "the ULX3S: DSPs, DDR3 or DDR4 and clocks of 100 MHz and more), for scale:",
              "", "| model | board | latency |", "|---|---|---:|"]
    lines += [f"| {m} | {b} | {t} |" for m, b, t in TENSIL]
    return "\n".join(lines) + "\n"


def _alone(row: dict) -> str:
    """The cycles with the transfers alone, and how many more (or fewer) than now."""
    alone = row.get("cycles_transfers_alone")
    if not alone:
        return "-"
    return f"{alone:,} ({alone / row['predicted_cycles'] - 1:+.1%})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--models", nargs="*", default=list(IMAGENET), choices=list(IMAGENET))
    parser.add_argument("--bitstream", action="store_true",
                        help="build each fitting model's bitstream for its Fmax")
    parser.add_argument("--resume", action="store_true",
                        help="keep the models already in imagenet.json (adding the bitstream "
                             "with --bitstream) instead of running them again")
    args = parser.parse_args(argv)
    saved = args.out / "imagenet.json"
    rows = {r["model"]: r for r in json.loads(saved.read_text())} \
        if args.resume and saved.exists() else {}
    kept = set(rows)
    for name in args.models:            # every row is written as soon as it changes
        r = rows[name] if name in kept else measure(name)
        rows[name] = r
        print(f"{name}: {r['predicted_cycles']:,} cycles ({r['simulated_cycles']:,} simulated), "
              f"{r['external_bytes']:,} external bytes, {r['memory_bound_fraction']:.1%} "
              f"memory-bound, compile {r['compile_seconds']} s, simulation "
              f"{r['simulation_seconds']} s", flush=True)
        write_results(args.out, "imagenet", list(rows.values()), markdown(rows.values()))
        if args.bitstream and r["fits"] and not r.get("fmax_mhz"):
            add_bitstream(r)
            write_results(args.out, "imagenet", list(rows.values()), markdown(rows.values()))
    print(markdown(rows.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
