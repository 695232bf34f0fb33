"""What a sweep writes beside its point records: ``explore.json`` (every point, the Pareto
fronts, the recommendation), ``explore.md`` (the same for people) and ``explore.png`` (latency
against DSP blocks, block RAMs and LUTs, the fronts marked). All are made again from the
records at the end of each run, each written whole (:mod:`.files`)."""

import io
import time
from pathlib import Path

from .files import write_atomic, write_json
from .pareto import RESOURCE_NAMES, RESOURCES, RULE, format_ms, fronts, recommend
from .point import STATUSES, device_capacity

__all__ = ["summarize", "write_outputs", "markdown", "plot_png", "text_summary"]

_SHORT = {"dsp": "DSP", "bram": "BRAM", "luts": "LUT"}


def _build_command(summary: dict, record: dict) -> str:
    options = [f"--board {summary['board']}", f"--rows {record['rows']}",
               f"--cols {record['cols']}"]
    for name, value in sorted(record.get("depths", {}).items()):
        flag = name.replace("_", "-")
        options.append(f"--{flag} {value}")
    if summary.get("calib"):
        options.append(f"--calib {summary['calib']}")
    if summary.get("calibrate"):
        options.append(f"--calibrate {summary['calibrate']}")
    if summary["bitstream"]:
        options.append("--bitstream")
    return f"hwonnx build {summary['model']} {' '.join(options)} -o build-{record['array']}/"


def summarize(records: "list[dict]", *, board, model: str, calib: "str | None", rows, cols,
              depths: dict, bitstream: bool, sim: int) -> dict:
    """The summary of a sweep (``explore.json``) from its point records, in sweep order."""
    device = device_capacity(board)
    pareto = fronts(records)
    chosen, why = recommend(records, device)
    counts = {status: sum(r["status"] == status for r in records) for status in STATUSES}
    done = [r for r in records if r["status"] == "ok"]
    measured = any(r.get("resources_source", {}).get(n) == "nextpnr" for r in done
                   for n in RESOURCES)
    estimated = any(r.get("resources_source", {}).get(n) == "estimate" for r in done
                    for n in RESOURCES)
    summary = {
        "model": model, "calib": calib, "board": board.name,
        "board_description": board.description, "board_clock_mhz": board.clock_hz / 1e6,
        "rows": list(rows), "cols": list(cols), "depths": dict(depths) or "auto",
        "bitstream": bitstream, "sim": sim, "device": device,
        "latency_clock": ("each point's Fmax from its bitstream (nextpnr)" if bitstream else
                          f"the board clock, {board.clock_hz / 1e6:g} MHz (no bitstreams; "
                          f"--bitstream measures each point's Fmax)"),
        "resources_source": ("nextpnr's place-and-route report" + (
            " (the fit-check estimate where it names no figure)" if estimated else "")
            if measured else "hwonnx's fit-check estimate (errs on the large side; "
            "--bitstream reads nextpnr's figures)" + (
                " of the ECP5 family: board 'sim' has no device" if device is None else "")),
        "counts": counts, "points": records, "pareto": pareto, "rule": RULE,
        "recommendation": None if chosen is None else {
            "key": chosen["key"], "array": chosen["array"], "why": why},
        "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if chosen is None:
        summary["recommendation_note"] = why
    else:
        summary["recommendation"]["build_command"] = _build_command(summary, chosen)
    return summary


def write_outputs(out: Path, summary: dict) -> None:
    """``out/explore.json``, ``explore.md`` and ``explore.png``, each written whole."""
    out = Path(out)
    write_json(out / "explore.json", summary)
    write_atomic(out / "explore.md", markdown(summary))
    write_atomic(out / "explore.png", plot_png(summary))


def _fronts_of(summary: dict, key: str) -> "list[str]":
    pareto = summary["pareto"]
    names = (["all"] if key in pareto["all"] else []) + [
        _SHORT[n] for n in RESOURCES if key in pareto[n]]
    return names


def _status(record: dict) -> str:
    return {"ok": "ok", "does-not-fit": "does not fit", "failed": "failed",
            "timeout": "timed out"}.get(record["status"], record["status"])


def _rows(summary: dict) -> "list[list[str]]":
    """The points as table cells: array, status, cycles, latency, inferences/s, DSP, block
    RAM, LUTs, fronts."""
    chosen = (summary["recommendation"] or {}).get("key")
    rows = []
    for r in summary["points"]:
        ok = r["status"] == "ok"
        used = r.get("resources") if ok else r.get("estimate")
        cells = [r["array"] + (" *" if r["key"] == chosen else ""), _status(r),
                 f"{r['predicted_cycles']:,}" if r.get("predicted_cycles") else "-",
                 format_ms(r["latency_s"]) if ok else "-",
                 f"{r['throughput_per_s']:,.0f}" if ok else "-"]
        cells += [(f"{used[n]:,}" + ("" if ok else " (needs)")) if used else "-"
                  for n in RESOURCES]
        cells.append(", ".join(_fronts_of(summary, r["key"])) if ok else "")
        rows.append(cells)
    return rows


_HEADER = ["array", "status", "predicted cycles", "latency", "inferences/s", "DSP",
           "block RAM", "LUTs", "Pareto front"]


def markdown(summary: dict) -> str:
    counts = ", ".join(f"{n} " + ("do not fit" if s == "does-not-fit" and n > 1
                                  else _status({"status": s}))
                       for s, n in summary["counts"].items() if n)
    device = summary["device"]
    lines = [f"# hwonnx explore: {summary['model']} on {summary['board']}", "",
             f"Board `{summary['board']}` ({summary['board_description']}"
             + (f": {device['dsp']:,} DSP blocks, {device['bram']:,} block RAMs, "
                f"{device['luts']:,} LUTs" if device else "") + "). "
             f"Arrays of rows {', '.join(map(str, summary['rows']))} x columns "
             f"{', '.join(map(str, summary['cols']))}, buffer depths "
             + (", ".join(f"{k} {v}" for k, v in summary["depths"].items())
                + " fixed, the others sized to the model"
                if isinstance(summary["depths"], dict) else "sized to the model (auto)")
             + f": {len(summary['points'])} points, {counts}.", "",
             f"- Latency: the predicted cycles (the compiler's exact cycle model) at "
             f"{summary['latency_clock']}. Throughput: 1 / latency (one inference at a time).",
             f"- Resources: {summary['resources_source']}.",
             "- Simulation: " + (f"{summary['sim']} samples per point on the RTL (Verilator), "
                                 f"bit-exact against the golden model and in the predicted "
                                 f"cycles" if summary["sim"] else "none (--sim N runs N "
                                                                  "samples per point)") + ".",
             "", "## Recommendation", ""]
    rec = summary["recommendation"]
    if rec:
        lines += [f"**{rec['array']}**: {rec['why']}", "", "Build it:", "", "```sh",
                  rec["build_command"], "```", ""]
    else:
        lines += [summary.get("recommendation_note", ""), ""]
    lines += [f"Rule: {summary['rule']}", "", "## Points", "",
              "`*` marks the recommended point. *Pareto front*: the fronts the point is on: "
              "`all` (latency against DSP blocks, block RAMs and LUTs together: no other point "
              "is as fast and as small in all three and better in one), and latency against "
              "each resource alone. For a point that does not fit, the resources are what its "
              "configuration would need (the fit check's estimate).", "",
              "| " + " | ".join(_HEADER) + " |",
              "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(summary)]
    pareto = summary["pareto"]
    names = {r["key"]: r["array"] for r in summary["points"]}
    lines += ["", "## Pareto front", "",
              f"- Latency against all three resources: "
              f"{', '.join(names[k] for k in pareto['all']) or 'none'}"]
    lines += [f"- Latency against {RESOURCE_NAMES[n]}: "
              f"{', '.join(names[k] for k in pareto[n]) or 'none'}" for n in RESOURCES]
    others = [r for r in summary["points"] if r["status"] != "ok"]
    if others:
        lines += ["", "## Points that did not succeed", ""]
        lines += [f"- **{r['array']}** ({_status(r)}): {r.get('reason') or 'no reason given'}"
                  for r in others]
    lines += ["", "![Latency against resources, the Pareto fronts marked](explore.png)", "",
              f"Each point's record (configuration, cycles, resources, bitstream and "
              f"simulation results, time taken) is in `points/<key>.json`; `explore.json` "
              f"holds them all. Generated {summary['generated']}.", ""]
    return "\n".join(lines)


def text_summary(summary: dict, out: Path) -> str:
    """The sweep for the terminal: the table of points, the recommendation, the files."""
    table = [_HEADER, *_rows(summary)]
    widths = [max(len(row[i]) for row in table) for i in range(len(_HEADER))]
    right = {2, 3, 4, 5, 6, 7}
    lines = ["  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                       for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
             for row in table]
    lines += ["", f"Latency at {summary['latency_clock']}; resources: "
                  f"{summary['resources_source']}."]
    rec = summary["recommendation"]
    lines += ["", f"Recommended: {rec['array']}: {rec['why']}" if rec
              else summary.get("recommendation_note", "")]
    if rec:
        lines += [f"Build it: {rec['build_command']}"]
    lines += ["", f"Wrote {out / 'explore.json'}, {out / 'explore.md'} and "
                  f"{out / 'explore.png'}"]
    return "\n".join(lines)


def plot_png(summary: dict) -> bytes:
    """Latency against each resource, one panel each: the successful points, each panel's
    Pareto front joined and labelled, the recommended point starred, the points that do not
    fit as crosses at what they would need, and the device's capacity."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(15, 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(RESOURCES), sharey=True)
    points = summary["points"]
    done = [r for r in points if r["status"] == "ok"]
    unfit = [r for r in points if r["status"] == "does-not-fit" and r.get("estimate")
             and r.get("latency_s")]
    chosen = (summary["recommendation"] or {}).get("key")
    scale, unit = (1e3, "ms") if max([r["latency_s"] for r in done + unfit] or [1]) >= 1e-3 \
        else (1e6, "us")
    for ax, name in zip(axes, RESOURCES):
        on = set(summary["pareto"][name])
        front = sorted((r for r in done if r["key"] in on),
                       key=lambda r: (r["resources"][name], r["latency_s"]))
        rest = [r for r in done if r["key"] not in on]
        ax.scatter([r["resources"][name] for r in rest],
                   [r["latency_s"] * scale for r in rest], s=30, color="tab:blue", alpha=0.6,
                   label="point")
        for r in rest:
            ax.annotate(r["array"], (r["resources"][name], r["latency_s"] * scale),
                        textcoords="offset points", xytext=(4, 4), fontsize=7, color="tab:blue")
        if unfit:
            ax.scatter([r["estimate"][name] for r in unfit],
                       [r["latency_s"] * scale for r in unfit], marker="x", s=30,
                       color="0.6", label="does not fit (needs)")
            for r in unfit:
                ax.annotate(r["array"], (r["estimate"][name], r["latency_s"] * scale),
                            textcoords="offset points", xytext=(4, 4), fontsize=7,
                            color="0.5")
        if front:
            ax.step([r["resources"][name] for r in front],
                    [r["latency_s"] * scale for r in front], where="post", color="tab:orange",
                    alpha=0.7)
            ax.scatter([r["resources"][name] for r in front],
                       [r["latency_s"] * scale for r in front], s=50, color="tab:orange",
                       edgecolor="black", zorder=3, label="Pareto front")
            for r in front:
                ax.annotate(r["array"], (r["resources"][name], r["latency_s"] * scale),
                            textcoords="offset points", xytext=(5, 5), fontsize=8)
        for r in done:
            if r["key"] == chosen:
                ax.scatter([r["resources"][name]], [r["latency_s"] * scale], marker="*",
                           s=260, color="tab:red", edgecolor="black", zorder=4,
                           label=f"recommended ({r['array']})")
        if summary["device"]:
            ax.axvline(summary["device"][name], color="tab:red", linestyle="--", alpha=0.5,
                       label="device")
        ax.set_xlabel(RESOURCE_NAMES[name])
        ax.grid(True, alpha=0.3)
        ax.set_xlim(left=0)
    axes[0].set_ylabel(f"latency ({unit})")
    axes[0].set_ylim(0, 1.12 * max([r["latency_s"] * scale for r in done + unfit] or [1]))
    legend = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    figure.legend(legend.values(), legend.keys(), loc="outside lower center",
                  ncols=len(legend), fontsize=9)
    figure.suptitle(f"{Path(summary['model']).name} on {summary['board']}: latency at "
                    + ("Fmax" if summary["bitstream"] else
                       f"{summary['board_clock_mhz']:g} MHz") + ", resources from "
                    + ("nextpnr" if summary["bitstream"] else "the fit-check estimate"))
    stream = io.BytesIO()
    figure.savefig(stream, format="png")
    return stream.getvalue()
