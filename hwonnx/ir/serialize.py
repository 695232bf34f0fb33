"""Save and load a :class:`Graph` as ``<stem>.json`` (structure, and the constants' names) plus
``<stem>.npz`` (the constants, ``c0``, ``c1``, ... in the order of their names), so a build
folder carries the integer graph the golden model evaluates, whatever its value names hold."""

import json
from pathlib import Path

import numpy as np

from .graph import Graph, Node, TensorType

__all__ = ["save_graph", "load_graph"]


def _plain(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def save_graph(graph: Graph, folder: Path, stem: str = "graph") -> None:
    folder = Path(folder)
    doc = {
        "inputs": list(graph.inputs), "outputs": list(graph.outputs),
        "types": {k: {"dtype": t.dtype, "shape": list(t.shape)} for k, t in graph.types.items()},
        "nodes": [{"name": n.name, "op": n.op, "inputs": list(n.inputs),
                   "outputs": list(n.outputs), "attrs": _plain(dict(n.attrs))}
                  for n in graph.nodes],
        "meta": _plain(dict(graph.meta)),
        "constants": list(graph.constants),
    }
    (folder / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    # keyed by index, named in the JSON: a zip member name ends at a NUL (and two names
    # that agree up to one would collide)
    np.savez(folder / f"{stem}.npz",
             **{f"c{i}": np.asarray(v) for i, v in enumerate(graph.constants.values())})


def _tuples(value):
    return tuple(value) if isinstance(value, list) else value


def load_graph(folder: Path, stem: str = "graph") -> Graph:
    folder = Path(folder)
    doc = json.loads((folder / f"{stem}.json").read_text())
    with open(folder / f"{stem}.npz", "rb") as stream, np.load(stream) as npz:
        # (the stream closes even if np.load fails); a folder written before the names
        # were listed keyed the archive by name
        names = doc.get("constants")
        constants = {k: npz[k] for k in npz.files} if names is None else \
            {name: npz[f"c{i}"] for i, name in enumerate(names)}
    nodes = [Node(n["name"], n["op"], n["inputs"], n["outputs"],
                  {k: _tuples(v) for k, v in n["attrs"].items()}) for n in doc["nodes"]]
    types = {k: TensorType(t["dtype"], tuple(t["shape"])) for k, t in doc["types"].items()}
    return Graph(nodes, doc["inputs"], doc["outputs"], types, constants, doc["meta"])
