"""Save and load a :class:`Graph` as ``<stem>.json`` (structure) plus ``<stem>.npz``
(constants), so a build folder carries the integer graph the golden model evaluates."""

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
    }
    (folder / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    np.savez(folder / f"{stem}.npz", **{k: np.asarray(v) for k, v in graph.constants.items()})


def _tuples(value):
    return tuple(value) if isinstance(value, list) else value


def load_graph(folder: Path, stem: str = "graph") -> Graph:
    folder = Path(folder)
    doc = json.loads((folder / f"{stem}.json").read_text())
    with open(folder / f"{stem}.npz", "rb") as stream, np.load(stream) as npz:
        constants = {k: npz[k] for k in npz.files}    # the stream closes even if np.load fails
    nodes = [Node(n["name"], n["op"], n["inputs"], n["outputs"],
                  {k: _tuples(v) for k, v in n["attrs"].items()}) for n in doc["nodes"]]
    types = {k: TensorType(t["dtype"], tuple(t["shape"])) for k, t in doc["types"].items()}
    return Graph(nodes, doc["inputs"], doc["outputs"], types, constants, doc["meta"])
