from .graph import Graph, IRVerificationError, Node, TensorType

__all__ = ["Graph", "IRVerificationError", "Node", "TensorType"]
from .serialize import load_graph, save_graph  # noqa: E402

__all__ += ["load_graph", "save_graph"]
