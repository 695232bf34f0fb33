"""The build report: per layer MACs, tiles, predicted cycles and utilization (JSON and
Markdown)."""

import json
from pathlib import Path

from .compiler.lower import Program
from .compiler.timing import predict

__all__ = ["layer_cycles", "build_report", "write_report"]


def layer_cycles(program: Program) -> "list[int]":
    """Predicted cycles of each layer: the total of the program truncated after the layer
    minus the total truncated after the previous one (layers overlap in the hardware, so
    this is each layer's share of the timeline)."""
    totals = [predict(program.truncated(i).instructions, program.config).total
              for i in range(len(program.layers))]
    return [t - (totals[i - 1] if i else 0) for i, t in enumerate(totals)]


def build_report(program: Program, model: str, board: str, meta: dict) -> dict:
    cfg = program.config
    pes = cfg.rows * cfg.cols
    cycles = layer_cycles(program)
    total = predict(program.instructions, cfg).total
    layers = []
    for layer, layer_cycles_ in zip(program.layers, cycles):
        layers.append({"name": layer.name, "op": layer.op, "macs": layer.macs,
                       "tiles": layer.tiles, "predicted_cycles": layer_cycles_,
                       "utilization": layer.macs / (layer_cycles_ * pes) if layer_cycles_ else 0})
    notes = list(meta.get("notes", ()))
    return {
        "model": model, "board": board, "arch": cfg.to_dict(),
        "model_info": {k: meta.get(k) for k in ("producer_name", "producer_version",
                                                "ir_version", "opset", "model_version",
                                                "model_author", "model_license", "doc_string")
                       if meta.get(k) not in (None, "")},
        "metadata_props": dict(meta.get("metadata_props") or {}),
        "warnings": list(meta.get("warnings", ())),
        "quantization": {k: meta.get(k) for k in ("calibration", "calibration_samples",
                                                  "activation_quantization",
                                                  "weight_quantization")},
        "rounding": "requantize: (v * mult + 2**(shift-1)) >> shift (half up); "
                    "host input: round half to even",
        "layers": layers,
        "total": {"macs": program.macs, "predicted_cycles": total,
                  "utilization": program.macs / (total * pes) if total else 0},
        "buffers": {name: {"used": used, "depth": getattr(cfg, f"{name}_depth")}
                    for name, used in program.words.items()},
        "notes": notes,
    }


def write_report(report: dict, folder: Path) -> None:
    folder = Path(folder)
    (folder / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    arch = report["arch"]
    lines = [f"# hwonnx build report: {report['model']}", "",
             f"Board `{report['board']}`, array {arch['rows']}x{arch['cols']} "
             f"(weight-stationary, int8 x int8 -> int32).", "",
             "Quantization: " + ", ".join(f"{k} = {v}" for k, v in
                                         report["quantization"].items() if v is not None),
             "", f"Rounding: {report['rounding']}", "",
             "| layer | op | MACs | tiles | predicted cycles | utilization |",
             "|---|---|---:|---:|---:|---:|"]
    for layer in report["layers"]:
        lines.append(f"| {layer['name']} | {layer['op']} | {layer['macs']:,} | "
                     f"{layer['tiles']} | {layer['predicted_cycles']:,} | "
                     f"{layer['utilization']:.1%} |")
    total = report["total"]
    lines += [f"| **total** | | {total['macs']:,} | | {total['predicted_cycles']:,} | "
              f"{total['utilization']:.1%} |", "", "| buffer | used words | depth |",
              "|---|---:|---:|"]
    lines += [f"| {name} | {b['used']} | {b['depth']} |" for name, b in report["buffers"].items()]
    if report["model_info"]:
        lines += ["", "Model: " + ", ".join(f"{k} {v}" for k, v in report["model_info"].items())]
    if report["notes"] or report["warnings"]:
        lines += ["", "Notes:"] + [f"- {note}" for note in report["notes"] + report["warnings"]]
    if report["metadata_props"]:
        lines += ["", "Model metadata: " + ", ".join(f"{k} = {v}" for k, v in
                                                     report["metadata_props"].items())]
    (folder / "report.md").write_text("\n".join(lines) + "\n")
