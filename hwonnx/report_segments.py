"""The report's segments of a segmented build (``graph.meta["segments"]``,
:mod:`hwonnx.compiler.segments`): per segment its layers, ports and predicted cycles, and per
boundary the host round trip, as JSON (``report.json``) and Markdown (``report.md``)."""

from .boards.protocol import BITS_PER_BYTE, transfer_bytes
from .compiler.program import Program
from .compiler.segments import host_steps_before, round_trips
from .compiler.timing import predict
from .ir import Graph

__all__ = ["segments_report", "segments_markdown"]


def segments_report(graph: Graph, programs: "list[Program]", baud: int) -> dict:
    """The report's ``segments``: per segment its layers, ports and predicted cycles, the host
    steps before it; per boundary the host round trip: the values read back and written,
    their bytes each way, and the time the host link would take at ``baud`` (8N1 frames of
    :mod:`hwonnx.boards.protocol`)."""
    before = host_steps_before(graph)
    segments = [{"index": i + 1, "host_steps_before": before[i],
                 "layers": [layer.name for layer in p.layers],
                 "inputs": [port.value for port in p.inputs],
                 "outputs": [port.value for port in p.outputs],
                 "macs": p.macs, "predicted_cycles": predict(p.expanded(), p.config).total}
                for i, p in enumerate(programs)]
    trips = []
    for trip in round_trips(programs):
        wire = sum(transfer_bytes(trip.rows, 0, w) for _, _, w in trip.read) \
            + sum(transfer_bytes(trip.rows, w, 0) for _, _, w in trip.written)
        trips.append({"after_segment": trip.after + 1, "host_steps": before[trip.after + 1],
                      "read": [{"value": v, "elements": n, "words": w} for v, n, w in trip.read],
                      "written": [{"value": v, "elements": n, "words": w}
                                  for v, n, w in trip.written],
                      "read_bytes": trip.read_bytes, "written_bytes": trip.written_bytes,
                      "link_bytes": wire, "baud": baud,
                      "link_seconds": wire * BITS_PER_BYTE / baud})
    return {"segments": segments, "round_trips": trips}


def segments_markdown(report: dict, clock_hz: int) -> "list[str]":
    """Markdown lines of :func:`segments_report` for ``report.md``."""
    lines = ["", "Segments (each a separate accelerator run; the host steps run between them):",
             "", "| segment | host steps before | layers | inputs | outputs | predicted cycles |",
             "|---|---|---|---|---|---:|"]
    lines += [f"| {s['index']} | {', '.join(s['host_steps_before']) or '-'} | "
              f"{', '.join(s['layers'])} | {', '.join(s['inputs'])} | "
              f"{', '.join(s['outputs'])} | {s['predicted_cycles']:,} |"
              for s in report["segments"]]
    lines += ["", "Host round trips (per inference):", "",
              "| after segment | host steps | read back | bytes read | bytes written | "
              "UART bytes | UART time | accelerator cycles at that time |",
              "|---:|---|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {t['after_segment']} | {', '.join(t['host_steps'])} | "
              f"{', '.join(r['value'] for r in t['read'])} | {t['read_bytes']:,} | "
              f"{t['written_bytes']:,} | {t['link_bytes']:,} | "
              f"{t['link_seconds'] * 1e3:.1f} ms at {t['baud']:,} baud | "
              f"{round(t['link_seconds'] * clock_hz):,} |"
              for t in report["round_trips"]]
    return lines
