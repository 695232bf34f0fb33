"""The ONNX frontend: the only part of hwonnx that touches onnx protobufs."""

from .load import (ImportedModel, finish_import, import_model, load_model, model_meta,
                   read_model)
from .overrides import read_overrides

__all__ = ["ImportedModel", "finish_import", "import_model", "load_model", "model_meta",
           "read_model", "read_overrides"]
