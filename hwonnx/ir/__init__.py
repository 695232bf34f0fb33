from .graph import Graph, IRVerificationError, Node, TensorType

__all__ = ["Graph", "IRVerificationError", "Node", "TensorType"]
