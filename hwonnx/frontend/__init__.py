"""The ONNX frontend: the only part of hwonnx that touches onnx protobufs."""

from .load import load_model, read_model

__all__ = ["load_model", "read_model"]
