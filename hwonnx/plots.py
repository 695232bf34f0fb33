"""The build report's chart, ``report.png``: where the predicted cycles of each layer go
(:func:`hwonnx.compiler.timing.cycle_breakdown`), one horizontal stacked bar per layer in program
order, and for a segmented build a bar per host round trip between segments. Drawn with
matplotlib's object API on the Agg canvas (no pyplot, no global state)."""

import contextlib
import os
import secrets
import warnings
from pathlib import Path

__all__ = ["chart_rows", "cycle_figure", "write_cycle_chart", "MAX_BARS"]

#: Bars a chart shows before it folds: a model of more layers shows its costliest ones in
#: program order, and one bar for the rest.
MAX_BARS = 40
#: Category key, legend label and colour of each stacked part; ``unsplit``: the cycles of a
#: layer of a report written before the breakdown existed.
_PARTS = (("compute", "compute (array fed)", "#1f77b4"),
          ("weight_loads", "weight loads (LOADW / LOADX)", "#ff7f0e"),
          ("boundaries", "boundaries (drain, post-processing)", "#2ca02c"),
          ("host", "host (round trips)", "#d62728"))
_UNSPLIT = ("unsplit", "not split (older report)", "#a0a0a0")


def chart_rows(report: dict) -> "list[tuple[str, dict]]":
    """The chart's bars in order, each ``(label, {category: cycles})``: the layers, and after
    the last layer of a segment the host round trip that follows it (its UART time in
    accelerator cycles at the architecture's clock)."""
    clock = report["arch"]["clock_hz"]
    trips = {t["after_segment"]: t for t in report.get("round_trips", ())}
    rows = []
    for index, layer in enumerate(report["layers"]):
        split = layer.get("cycle_breakdown") or {"unsplit": layer["predicted_cycles"]}
        rows.append((layer["name"], dict(split)))
        segment = layer.get("segment")
        following = report["layers"][index + 1].get("segment") \
            if index + 1 < len(report["layers"]) else None
        if segment in trips and following != segment:
            rows.append((f"host after segment {segment}",
                         {"host": round(trips[segment]["link_seconds"] * clock)}))
    return rows


def _fold(rows: "list[tuple[str, dict]]") -> "tuple[list[tuple[str, dict]], int]":
    """At most :data:`MAX_BARS` bars and one more: the costliest in their order, then one for
    the rest; and how many bars that one holds (0: nothing folded)."""
    if len(rows) <= MAX_BARS:
        return rows, 0
    ranked = sorted(range(len(rows)), key=lambda i: -sum(rows[i][1].values()))
    keep = sorted(ranked[:MAX_BARS])
    rest: "dict[str, int]" = {}
    for i in ranked[MAX_BARS:]:
        for key, value in rows[i][1].items():
            rest[key] = rest.get(key, 0) + value
    folded = len(rows) - len(keep)
    return [rows[i] for i in keep] + [(f"{folded} others", rest)], folded


def _label(text: str, width: int = 32) -> str:
    """``text`` on one line, shortened to ``width`` characters in the middle (exporters'
    names differ at both ends: ``/features/features.3/conv/Conv``)."""
    text = "".join(c if c.isprintable() else " " for c in text)
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "\u2026" + text[len(text) - (width - 1 - head):]


def cycle_figure(report: dict):
    """The chart of ``report`` (:func:`hwonnx.report.build_report`'s dict) as a matplotlib
    ``Figure`` on an Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    every = chart_rows(report)
    rows, folded = _fold(every)
    parts = list(_PARTS) + ([_UNSPLIT] if any("unsplit" in r[1] for r in rows) else [])
    font = 9 if len(rows) <= 20 else 7
    height = min(2.4 + 0.28 * len(rows), 14.0)
    figure = Figure(figsize=(10, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    positions = range(len(rows))
    left = [0] * len(rows)
    for key, label, colour in parts:
        widths = [split.get(key, 0) for _, split in rows]
        axes.barh(positions, widths, left=left, color=colour, label=label, height=0.7)
        left = [a + b for a, b in zip(left, widths)]
    for position, width in zip(positions, left):
        axes.annotate(f"{width:,}", (width, position), xytext=(3, 0),
                      textcoords="offset points", va="center", fontsize=font - 1)
    axes.set_yticks(list(positions), [_label(name) for name, _ in rows], fontsize=font,
                    parse_math=False)           # names are text: "$" is no formula
    axes.set_ylim(len(rows) - 0.5, -0.5)    # program order, top to bottom
    axes.set_xlim(0, max(max(left, default=0), 1) * 1.12)
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    axes.tick_params(axis="x", labelsize=font)
    axes.set_xlabel("cycles")
    axes.grid(axis="x", alpha=0.3)
    axes.set_axisbelow(True)
    figure.legend(loc="outside lower center", ncols=len(parts) if len(parts) <= 4 else 3,
                  fontsize=font, frameon=False)
    arch, total = report["arch"], report["total"]
    model = str(report["model"])        # a path, or "in-memory model (graph ...)" (api)
    name = _label(Path(model).name, 60) if "\n" not in model else "model"
    title = (f"{name} ({report['board']}): "
             f"{total['predicted_cycles']:,} predicted cycles per inference on a "
             f"{arch['rows']}x{arch['cols']} array "
             f"({total['utilization']:.1%} utilization)")
    trips = report.get("round_trips") or ()
    if trips:
        host = sum(round(t["link_seconds"] * arch["clock_hz"]) for t in trips)
        title += (f"\nand {host:,} cycles of host round trips between segments (UART at "
                  f"{trips[0]['baud']:,} baud)")
    if folded:
        title += f"\nthe {MAX_BARS} costliest of {len(every)} bars; the other {folded} in one"
    axes.set_title(title, fontsize=font + 1, parse_math=False)
    return figure


def write_cycle_chart(report: dict, path: "str | os.PathLike") -> None:
    """Write :func:`cycle_figure` of ``report`` to ``path`` whole or not at all (into a
    temporary file beside it, renamed over it when complete): PNG, or SVG / PDF for a path
    ending so. Raises ``OSError`` if it cannot be written."""
    path = Path(path)
    kind = path.suffix.lower().lstrip(".")
    figure = cycle_figure(report)
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(partial, "xb") as stream, warnings.catch_warnings():
            # a name in a script the font lacks is drawn with boxes, not warned about
            warnings.filterwarnings("ignore", "Glyph .* missing from", UserWarning)
            figure.savefig(stream, format=kind if kind in ("svg", "pdf") else "png")
        os.replace(partial, path)
        partial = None
    finally:
        if partial is not None:
            with contextlib.suppress(OSError):
                os.unlink(partial)
