"""The build report: per layer MACs, tiles, weight memory, predicted cycles and utilization
(JSON and Markdown)."""

import json
from pathlib import Path

from .boards import estimate, get_board
from .boards.top import DEFAULT_BAUD
from .compiler.paging import pages_words
from .compiler.program import Program
from .compiler.segments import segment_graphs
from .compiler.timing import (CYCLE_CATEGORIES, cycle_breakdown, cycle_windows, layer_cycles,
                              program_timing)
from .ir.ops import IR_OPS, LAYOUT, integer_ops
from .isa import Op, instruction_width
from .plots import write_cycle_chart
from .report_segments import segments_markdown, segments_report

__all__ = ["layer_cycles", "cycle_windows", "cycle_breakdown", "build_report", "programs_report",
           "segmented_report", "write_report", "placement", "placement_table", "ports",
           "CYCLE_CATEGORIES"]

#: Where each integer op runs and why (from the operator registry).
_WHY = {entry.quantized: (entry.where, entry.why) for entry in IR_OPS.values() if entry.quantized}
_LAYOUT = integer_ops(LAYOUT)


def placement(graph) -> "list[dict]":
    """Where each node of the integer graph runs (hardware or host) and why; a host step at
    the start or end of the graph gives the frontend's reason (``graph.meta["host_steps"]``,
    see :mod:`hwonnx.frontend.host`); a node of a segmented graph says its segment."""
    steps = graph.meta.get("host_steps") or {}
    segment = {name: index + 1 for index, part in enumerate(graph.meta.get("segments") or ())
               for name in part["nodes"]}
    rows = []
    for node in graph.nodes:
        float_layout = node.op in _LAYOUT and \
            graph.types[node.outputs[0]].dtype != "int8"
        if node.name in steps and graph.types[node.outputs[0]].dtype != "int8":
            where, why = "host", steps[node.name]["why"]
        else:
            where, why = (("host", "layout of a host value") if float_layout
                          else _WHY.get(node.op, ("host", "host operator")))
        activation = node.attrs.get("activation")
        if activation and node.attrs.get("table_node"):
            why += f"; then {activation} '{node.attrs['table_node']}' by a lookup table"
        elif activation:            # a one-source QConcat: an exact copy into the table
            why = (f"{activation}: a 256-entry lookup table in the post-processor, applied "
                   f"to an exact copy of its input")
        if node.name in segment:
            where = f"{where}, segment {segment[node.name]}"
        rows.append({"node": node.name, "op": node.op, "where": where, "why": why})
    return rows


def placement_table(graph, *programs: Program) -> str:
    """Markdown table of :func:`placement`, with MACs and predicted cycles per array layer
    of ``programs`` (a segmented build's: every segment's)."""
    cycles = {layer.name: c for p in programs for layer, c in zip(p.layers, layer_cycles(p))}
    macs = {layer.name: layer.macs for p in programs for layer in p.layers}
    streamed = {p.layers[i.layer].name for p in programs for i in p.expanded() if i.get("dw")}
    lines = ["| node | op | runs on | MACs | predicted cycles | why |",
             "|---|---|---|---:|---:|---|"]
    for row in placement(graph):
        why = row["why"] + ("; depthwise streaming: channels across the columns, kernel "
                            "columns down the rows" if row["node"] in streamed else "")
        lines.append(f"| {row['node']} | {row['op']} | {row['where']} | "
                     f"{macs.get(row['node'], '')} | {cycles.get(row['node'], '')} | {why} |")
    return "\n".join(lines)


def ports(program: Program, graph) -> "dict[str, list[dict]]":
    """Every input and output of the accelerator (``program.inputs``, ``program.outputs``):
    the float value on the host side (``name``), the int8 value on the accelerator's
    (``value``), its shape, the scale and zero point of its ``Quantize`` (``Dequantize``) in
    the integer ``graph``, and its placement (first word, words, and ``memory``: ``act``,
    the activation buffer, or ``ext``, the external memory)."""
    def entry(port, node) -> dict:
        where = program.placements[port.value]
        return {"name": port.name, "value": port.value, "shape": list(where.shape),
                "scale": float(node.attrs["scale"]),
                "zero_point": int(node.attrs["zero_point"]),
                "base": where.base, "words": where.words, "memory": where.memory}

    dequantize = {n.outputs[0]: n for n in graph.nodes if n.op == "Dequantize"}
    return {"inputs": [entry(p, graph.producer(p.value)) for p in program.inputs],
            "outputs": [entry(p, dequantize[p.name]) for p in program.outputs]}


def _rounding(program: Program) -> str:
    exact, setpost = set(), {}      # the layers of the POSTs issued with rne: stored, or the
    for instr in program.instructions:      # walker's (its SETPOST's fields; a LOOP issues
        if instr.op == Op.SETPOST:          # at least one POST)
            setpost = instr.fields
        elif instr.get("rne") if instr.op == Op.POST else (instr.op == Op.LOOP
                                                             and setpost.get("rne")):
            exact.add(program.layers[instr.layer].name)
    text = "requantize: (v * mult + 2**(shift-1)) >> shift (half up)"
    if exact:
        text += (f", except {len(exact)} layer(s) rounding as onnxruntime (float32 multiply, "
                 f"ties to even): {', '.join(sorted(exact))}")
    return text + "; host input: round half to even"


def build_report(program: Program, model: str, board: str, meta: dict, graph=None) -> dict:
    cfg = program.config
    pes = cfg.rows * cfg.cols
    cycles = layer_cycles(program)
    total = program_timing(program).total
    moved: "dict[int, int]" = {}            # layer -> activation words LOADA and STOREA move
    for instr in program.instructions:
        if instr.op in Op.ACTX:
            moved[instr.layer] = moved.get(instr.layer, 0) + instr["count"]
    layers = []
    for layer, layer_cycles_, split, window in zip(program.layers, cycles,
                                                   cycle_breakdown(program, cycles),
                                                   cycle_windows(program, cycles)):
        layers.append({"name": layer.name, "op": layer.op, "macs": layer.macs,
                       "tiles": layer.tiles, "predicted_cycles": layer_cycles_,
                       "cycle_window": list(window), "cycle_breakdown": split,
                       "weight_words": layer.wgt_words, "weight_bits": layer.wgt_bits,
                       "weight_bytes": layer.wgt_words * cfg.cols,
                       "utilization": layer.macs / (layer_cycles_ * pes) if layer_cycles_ else 0})
        if cfg.ext_memory:      # streamed weights: bytes, and the cycles their copy takes;
            act = moved.get(len(layers) - 1, 0)      # activations in and out (.spill)
            layers[-1].update(external_bytes=layer.ext_words * cfg.cols,
                              transfer_cycles=cfg.ext_timing.transfer_cycles(layer.ext_words,
                                                                             cfg.cols),
                              activation_bytes=act * cfg.rows,
                              activation_cycles=cfg.ext_timing.transfer_cycles(act, cfg.rows))
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
        "rounding": _rounding(program),
        "layer_check": [dict(row) for row in meta.get("layer_check", ())],
        "layers": layers,
        "placement": placement(graph) if graph is not None else [],
        "io": ports(program, graph) if graph is not None else {},
        "total": {"macs": program.macs, "predicted_cycles": total,
                  "utilization": program.macs / (total * pes) if total else 0},
        "buffers": {name: {"used": used, "depth": getattr(cfg, f"{name}_depth")}
                    for name, used in program.words.items()},
        "program": {"instructions": len(program.instructions),
                    "bits": len(program.instructions) * instruction_width(),
                    "issued": len(program_timing(program).dispatch),
                    "looped_layers": sum(i["op"] == Op.LOOP for i in program.instructions),
                    "page_bytes": pages_words(program) * cfg.cols},
        "resources": _resources(cfg, board),
        "notes": notes,
    }


def programs_report(programs: "tuple[Program, ...]", model: str, board: str, graph) -> dict:
    """The build report of ``programs`` compiled from the integer ``graph``: of one program,
    :func:`build_report`; of a segmented build's, :func:`segmented_report`."""
    if len(programs) == 1:
        return build_report(programs[0], model, board, dict(graph.meta), graph)
    return segmented_report(programs, model, board, graph)


def segmented_report(programs: "tuple[Program, ...]", model: str, board: str, graph) -> dict:
    """The build report of a segmented build: :func:`build_report`'s keys over all segments
    (layers in order, each with its ``segment``; totals; the buffers' largest use), the ports
    of every segment, and ``segments`` (:func:`~hwonnx.report_segments.segments_report`)."""
    graphs = segment_graphs(graph)
    parts = [build_report(p, model, board, dict(graph.meta)) for p in programs]
    report = parts[0]
    report["layers"] = [{**layer, "segment": i + 1}
                        for i, part in enumerate(parts) for layer in part["layers"]]
    macs = sum(p.macs for p in programs)
    cycles = sum(part["total"]["predicted_cycles"] for part in parts)
    pes = programs[0].config.rows * programs[0].config.cols
    report["total"] = {"macs": macs, "predicted_cycles": cycles,
                       "utilization": macs / (cycles * pes) if cycles else 0}
    report["buffers"] = {name: {"used": max(part["buffers"][name]["used"] for part in parts),
                                "depth": entry["depth"]}
                         for name, entry in report["buffers"].items()}
    report["program"] = {key: sum(part["program"][key] for part in parts)
                         for key in report["program"]}
    report["placement"] = placement(graph)
    io = [ports(p, g) for p, g in zip(programs, graphs)]
    report["io"] = {kind: [{**entry, "segment": i + 1} for i, part in enumerate(io)
                           for entry in part[kind]] for kind in ("inputs", "outputs")}
    report.update(segments_report(graph, list(programs), DEFAULT_BAUD))
    return report


def _resources(config, board: str) -> "dict | None":
    """The fit check's estimate of DSP blocks, block RAMs and logic cells on ``board``,
    against the device's (None for the simulation target)."""
    target = get_board(board)
    if target.is_simulation:
        return None
    usage = estimate(config, target)
    blocks = target.bram_kbits * 1024 // target.family_info.block_bits
    return {"dsp": {"used": usage.dsp, "device": target.dsp},
            "bram_blocks": {"used": usage.bram_blocks, "device": blocks,
                            "per_buffer": dict(usage.memories)},
            "luts": {"used": usage.luts, "device": target.luts}}


def _segment_of(port: dict) -> str:
    return f" (segment {port['segment']})" if "segment" in port else ""


def _window(layer: dict) -> str:
    """A layer's ``cycle_window`` for people: its first and last cycle (a report written
    before windows existed has none)."""
    if "cycle_window" not in layer:
        return ""
    first, end = layer["cycle_window"]
    return f"{first:,}–{end - 1:,}" if end > first else "-"


def write_report(report: dict, folder: Path) -> None:
    """Write ``report.json``, ``report.md`` and its chart ``report.png``
    (:func:`hwonnx.plots.write_cycle_chart`) into ``folder``."""
    folder = Path(folder)
    (folder / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    arch = report["arch"]
    lines = [f"# hwonnx build report: {report['model']}", "",
             f"Board `{report['board']}`, array {arch['rows']}x{arch['cols']} "
             f"(weight-stationary, int8 x int8 -> int32).", "",
             "Quantization: " + ", ".join(f"{k} = {v}" for k, v in
                                         report["quantization"].items() if v is not None),
             "", f"Rounding: {report['rounding']}", "",
             "| layer | op | MACs | tiles | weight bits | weight bytes | predicted cycles | "
             "utilization | cycle window |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for layer in report["layers"]:
        lines.append(f"| {layer['name']} | {layer['op']} | {layer['macs']:,} | "
                     f"{layer['tiles']} | "
                     f"{layer['weight_bits'] if layer['weight_words'] else '-'} | "
                     f"{layer['weight_bytes']:,} | "
                     f"{layer['predicted_cycles']:,} | {layer['utilization']:.1%} | "
                     f"{_window(layer)} |")
    total = report["total"]
    weights = sum(layer["weight_bytes"] for layer in report["layers"])
    lines += [f"| **total** | | {total['macs']:,} | | | {weights:,} | "
              f"{total['predicted_cycles']:,} | {total['utilization']:.1%} | |", "",
              "Cycle window: the values of the accelerator's `cycles` counter during the "
              "layer (it reads 0 from the clock edge at which the accelerator takes `start`"
              + ("; each segment's from its own start" if report.get("segments") else "")
              + "): where to look in a trace of the run (`hwonnx sim --trace`).", "",
              "Where each layer's cycles go (array fed, weight loads, boundaries between "
              "layers, host round trips):", "", "![cycles per layer](report.png)", ""]
    if "external_bytes" in report["layers"][0]:
        lines += [f"External memory `{arch['ext_memory']}`: the weights of the layers below "
                  f"stream into the weight buffer behind the computation (a copy takes its "
                  f"transfer cycles without refreshes; it overlaps the layers before its own); "
                  f"their activations move in and out through the staging buffers, beside "
                  f"the computation.",
                  "", "| layer | weight bytes streamed | transfer cycles | activation bytes "
                  "moved | transfer cycles | predicted cycles |",
                  "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {layer['name']} | {layer['external_bytes']:,} | "
                  f"{layer['transfer_cycles']:,} | {layer.get('activation_bytes', 0):,} | "
                  f"{layer.get('activation_cycles', 0):,} | {layer['predicted_cycles']:,} |"
                  for layer in report["layers"]
                  if layer["external_bytes"] or layer.get("activation_bytes")]
        lines += [""]
    lines += ["| buffer | used words | depth |",
              "|---|---:|---:|"]
    lines += [f"| {name} | {b['used']} | {b['depth']} |" for name, b in report["buffers"].items()]
    program = report["program"]
    lines += ["", f"Program: {program['instructions']} instructions ({program['bits']:,} bits), "
                  f"{program['looped_layers']} layer(s) looped; the dispatcher issues "
                  f"{program['issued']:,} with the tile walker's."]
    if program.get("page_bytes"):
        lines[-1] += (f" Paged: pages of {report['arch']['prog_page']} instructions from the "
                      f"external memory ({program['page_bytes']:,} bytes, read once per run).")
    if report.get("resources"):
        res = report["resources"]
        lines += ["", "Resources (hwonnx's estimate before synthesis; the bitstream build's "
                      "place-and-route report is the final word):", "",
                  "| resource | used | device |", "|---|---:|---:|",
                  f"| DSP blocks | {res['dsp']['used']} | {res['dsp']['device']} |",
                  f"| block RAMs | {res['bram_blocks']['used']} | "
                  f"{res['bram_blocks']['device']} |",
                  f"| logic cells | {res['luts']['used']:,} | {res['luts']['device']:,} |"]
    if report.get("layer_check"):
        lines += ["", "Golden against the float model on the calibration data "
                      "(int8 outputs dequantized):", "",
                  "| layer | float range | int8 range | coverage | max error (LSB) | "
                  "mean error (LSB) |", "|---|---|---|---:|---:|---:|"]
        lines += [f"| {r['layer']} | [{r['float_range'][0]:.4g}, {r['float_range'][1]:.4g}] | "
                  f"[{r['int8_range'][0]:.4g}, {r['int8_range'][1]:.4g}] | {r['coverage']:.0%} | "
                  f"{r['max_error_lsb']:.2f} | {r['mean_error_lsb']:.3f} |"
                  for r in report["layer_check"]]
    if report.get("io"):
        lines += ["", "| port | name | shape | scale | zero point | activation words |",
                  "|---|---|---|---:|---:|---|"]
        lines += [f"| {kind[:-1]} | {p['name']}{_segment_of(p)} | "
                  f"{'x'.join(map(str, p['shape']))} | "
                  f"{p['scale']:.6g} | {p['zero_point']} | {p['base']}..."
                  f"{p['base'] + p['words'] - 1} |"
                  for kind in ("inputs", "outputs") for p in report["io"][kind]]
    if report.get("segments"):
        lines += segments_markdown(report, arch["clock_hz"])
    if report.get("placement"):
        lines += ["", "| node | op | runs on | why |", "|---|---|---|---|"]
        lines += [f"| {r['node']} | {r['op']} | {r['where']} | {r['why']} |"
                  for r in report["placement"]]
    if report["model_info"]:
        lines += ["", "Model: " + ", ".join(f"{k} {v}" for k, v in report["model_info"].items())]
    if report["notes"] or report["warnings"]:
        lines += ["", "Notes:"] + [f"- {note}" for note in report["notes"] + report["warnings"]]
    if report["metadata_props"]:
        lines += ["", "Model metadata: " + ", ".join(f"{k} = {v}" for k, v in
                                                     report["metadata_props"].items())]
    (folder / "report.md").write_text("\n".join(lines) + "\n")
    write_cycle_chart(report, folder / "report.png")
