"""``hwonnx inspect``: show what the frontend read from a model (versions, producer, metadata,
inputs and outputs with their declared and bound shapes, the float graph, and every
conversion, note and warning)."""

import logging
import os
from collections import Counter
from pathlib import Path

import numpy as np

from .boards.top import DEFAULT_BAUD
from .compiler.program import Program
from .compiler.timing import predict
from .config import ArchConfig
from .errors import UsageError
from .frontend import load_model
from .ir.graph import Graph
from .pipeline import plan_programs
from .plots import write_cycle_chart
from .quant import load_samples, normalize_samples
from .quant.compare import best_method, compare_methods
from .report import placement_table, programs_report
from .report_segments import segments_markdown, segments_report

__all__ = ["inspect_model", "format_inspection", "format_placement", "load_for_inspection",
           "check_plot_path", "format_calibration"]


def inspect_model(path: "str | os.PathLike", input_shapes: "dict[str, tuple[int, ...]] | None"
                  = None, override_initializers: "dict[str, np.ndarray] | None" = None) -> str:
    """Read ``path`` with :func:`load_for_inspection` and return the report that ``hwonnx
    inspect`` prints first.

    Raises
    ------
    ModelError, UnsupportedOperatorError
        As :func:`~hwonnx.frontend.load_model` does; the CLI prints them as one
        ``hwonnx: error:`` line.
    """
    graph = load_for_inspection(path, input_shapes, override_initializers)
    return format_inspection(graph, os.fspath(path))


def load_for_inspection(path: "str | os.PathLike", input_shapes:
                        "dict[str, tuple[int, ...]] | None" = None,
                        override_initializers: "dict[str, np.ndarray] | None" = None) -> Graph:
    """:func:`~hwonnx.frontend.load_model`, without logging the frontend's warnings: the
    inspection lists them (``graph.meta["warnings"]``), so they are said once. If the model
    cannot be loaded, the warnings made before the error are logged after all."""
    logger = logging.getLogger("hwonnx.frontend")
    held: "list[logging.LogRecord]" = []

    def hold(record: logging.LogRecord) -> bool:
        held.append(record)
        return False

    logger.addFilter(hold)
    try:
        return load_model(path, input_shapes=input_shapes,
                          override_initializers=override_initializers)
    except Exception:
        logger.removeFilter(hold)
        for record in held:
            logger.handle(record)
        raise
    finally:
        logger.removeFilter(hold)


def format_placement(graph: Graph, config: ArchConfig, size: "str | None" = None, *,
                     plot: "str | os.PathLike | None" = None, model: str = "model") -> str:
    """Where each node of the float ``graph`` runs on the ``config`` array, with MACs and
    predicted cycles (as :func:`hwonnx.api.plan_model` plans it, without reading the model
    again, its buffers sized for ``size`` as ``hwonnx build`` sizes them): the report that
    ``hwonnx inspect`` prints second. Given ``plot``, also writes there the chart of where
    each layer's cycles go that a build writes as ``report.png`` (titled ``model``).

    Raises
    ------
    ResourceError
        If the model does not fit ``config`` (as :func:`~hwonnx.compiler.lower.lower`).
    UsageError
        If ``plot`` cannot be written.
    """
    if plot is not None:
        check_plot_path(plot)               # before the planning, which may take long
    int_graph, programs = plan_programs(graph, config=config, size=size)
    config = programs[0].config
    total = sum(predict(p.expanded(), config).total for p in programs)
    macs = sum(p.macs for p in programs)
    utilization = macs / (total * config.rows * config.cols)
    text = (f"Placement on a {config.name} array ({macs:,} MACs, {total:,} predicted cycles "
            f"per inference{f' in {len(programs)} segments' if len(programs) > 1 else ''}, "
            f"{utilization:.1%} utilization):\n" + placement_table(int_graph, *programs))
    if len(programs) > 1:
        report = segments_report(int_graph, list(programs), DEFAULT_BAUD)
        text += "\n" + "\n".join(segments_markdown(report, config.clock_hz))
        if size not in (None, "sim"):
            text += (f"\n\nA build for board '{size}' is refused: segmented builds run in "
                     f"simulation only (--board sim)")
    if plot is not None:
        _write_plot(int_graph, programs, model, size or "sim", plot)
    return text


def format_calibration(graph: Graph, calib) -> str:
    """The calibration methods compared on the float ``graph`` with the samples ``calib`` (a
    sample file, or arrays by input name; :func:`~hwonnx.quant.compare.compare_methods`),
    and the method ``hwonnx inspect --calib`` suggests: the one of smallest output error.

    Raises
    ------
    QuantizationError
        If ``calib`` cannot be read or does not fit the model's inputs.
    """
    samples = (normalize_samples(graph, calib, "Calibration data") if isinstance(calib, dict)
               else load_samples(calib, graph, "Calibration file"))
    rows = compare_methods(graph, samples)
    outputs = list(rows[0]["errors"])
    count = len(next(iter(samples.values())))
    lines = [f"Calibration methods on {count} calibration sample(s): the golden model's "
             f"output error against the float model (RMS, as a share of the float output's "
             f"range):",
             "| method | " + " | ".join(outputs) + " |", "|---|" + "---:|" * len(outputs)]
    lines += [f"| {row['method']} | " + " | ".join(f"{row['errors'][v]:.3%}" for v in outputs)
              + " |" for row in rows]
    best = best_method(rows)
    error = next(row["error"] for row in rows if row["method"] == best)
    lines.append(f"Suggested: --calibrate {best} (its largest output error, {error:.3%}, is "
                 f"the smallest)")
    return "\n".join(lines)


def check_plot_path(path: "str | os.PathLike") -> None:
    """Refuse a chart path (``hwonnx inspect --plot``) that cannot be written, before
    anything runs: :class:`~hwonnx.errors.UsageError`."""
    path = Path(path)
    why = "Is a directory" if path.is_dir() else None if path.parent.is_dir() else \
        "Not a directory" if path.parent.exists() else "No such file or directory"
    if why:
        raise UsageError(f"Cannot write the chart to '{path}': {why}")


def _write_plot(int_graph: Graph, programs: "tuple[Program, ...]", model: str, board: str,
                path: "str | os.PathLike") -> None:
    """The build's ``report.png`` of the planned ``programs`` (one, or a segmented model's),
    written to ``path``."""
    report = programs_report(programs, model, board, int_graph)
    try:
        write_cycle_chart(report, path)
    except OSError as error:
        raise UsageError(f"Cannot write the chart to '{path}': "
                         f"{error.strerror or error}") from error


def format_inspection(graph: Graph, source: str) -> str:
    """Format the metadata of a graph made by :func:`~hwonnx.frontend.load_model`."""
    meta = graph.meta
    opsets = ", ".join(f"{domain} {version}" for domain, version in
                       meta.get("opset_imports", {}).items())
    producer = " ".join(p for p in (meta.get("producer_name"), meta.get("producer_version"))
                        if p) or "(not given)"
    lines = [f"Model: {Path(source).name}",
             f"  IR version:    {meta.get('ir_version')}",
             f"  Opsets:        {opsets or '(none)'}",
             f"  Producer:      {producer}",
             f"  Domain:        {meta.get('domain') or '(not given)'}",
             f"  Model version: {meta.get('model_version')}",
             f"  Graph:         {meta.get('graph_name')}"]
    doc = " ".join(str(meta.get("doc_string", "")).split())
    if doc:
        lines.append(f"  Doc:           {doc[:200]}{'...' if len(doc) > 200 else ''}")
    for key in ("model_author", "model_license"):
        if meta.get(key):
            lines.append(f"  {key + ':':15}{meta[key]}")
    props = {k: v for k, v in meta.get("metadata_props", {}).items()
             if k not in ("model_author", "model_license")}
    if props:
        lines.append("  Metadata:")
        lines += [f"    {key}: {value}" for key, value in props.items()]
    for title, key in (("Inputs", "inputs"), ("Outputs", "outputs")):
        lines.append(f"{title}:")
        for value in meta.get(key, ()):
            bound = "x".join(str(d) for d in value["shape"]) or "scalar"
            declared = "" if value["declared"] == bound else f" (declared {value['declared']})"
            lines.append(f"  {value['name']}: {value['dtype']} {bound}{declared}")
    bindings = meta.get("dim_bindings", {})
    if bindings:
        lines.append("Dimension variables: " +
                     ", ".join(f"{name}={size}" for name, size in bindings.items()))
    ops = Counter(node.op for node in graph.nodes)
    lines.append(f"Float graph: {len(graph.nodes)} node(s)" +
                 (f" ({', '.join(f'{op} {n}' for op, n in ops.items())})" if ops else "") +
                 f", {len(graph.constants)} constant(s), "
                 f"{sum(np.asarray(c).size for c in graph.constants.values()):,} parameters")
    if meta.get("quantizers"):
        lines.append("Quantizers (bits, signedness, scale):")
        lines += [f"  {q['layer']}: {q['role']} {q['bits']}-bit "
                  f"{'signed' if q['signed'] else 'unsigned'}{' narrow' if q['narrow'] else ''}, "
                  f"{q['scale']} scale ({q['node']})"
                  for q in meta["quantizers"]]
    for title, key in (("Notes", "notes"), ("Warnings", "warnings")):
        if meta.get(key):
            lines.append(f"{title}:")
            lines += [f"  - {text}" for text in meta[key]]
    return "\n".join(lines)
