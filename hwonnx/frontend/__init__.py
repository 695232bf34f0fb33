"""The ONNX frontend: the only part of hwonnx that touches onnx protobufs."""

from .load import load_model, model_meta, read_model
from .overrides import read_overrides

__all__ = ["load_model", "model_meta", "read_model", "read_overrides"]
