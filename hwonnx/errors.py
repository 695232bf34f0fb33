"""Errors a user can cause. Anything else escaping to the CLI is a bug and keeps its traceback."""

__all__ = [
    "HwonnxError", "ModelError", "UnsupportedOperatorError", "QuantizationError",
    "ResourceError", "SimulationError", "ToolchainError", "MismatchError", "UsageError",
    "SweepError",
]


class HwonnxError(Exception):
    """Base class for every error a user can cause. The CLI prints ``str(error)`` on one line
    and exits with status 2."""


class ModelError(HwonnxError):
    """The model file is unreadable or breaks a rule of the ONNX IR specification."""


class UnsupportedOperatorError(HwonnxError):
    """The model uses operators hwonnx cannot map. ``nodes`` lists every offending node as
    ``(name, op_type, domain, opset)``."""

    def __init__(self, nodes: "list[tuple[str, str, str, int]]"):
        self.nodes = list(nodes)
        listed = "; ".join(f"node '{n}' {op} (domain '{d or 'ai.onnx'}', opset {v})"
                           for n, op, d, v in self.nodes)
        super().__init__(f"{len(self.nodes)} unsupported node(s): {listed}")
        self.reasons: "list[str]" = []

    @classmethod
    def with_reasons(cls, nodes: "list[tuple[str, str, str, int]]",
                     reasons: "list[str]") -> "UnsupportedOperatorError":
        """The error for ``nodes``, its message ending with ``reasons`` in parentheses."""
        error = cls(nodes)
        error.reasons = list(reasons)
        if reasons:
            error.args = (f"{error} ({'; '.join(reasons)})",)
        return error


class UsageError(HwonnxError):
    """A path or option given to hwonnx cannot be used (for example an output folder that is
    a file)."""


class QuantizationError(HwonnxError):
    """Calibration data is missing or does not fit the model."""


class ResourceError(HwonnxError):
    """The model does not fit the selected architecture or board."""


class ToolchainError(HwonnxError):
    """A tool hwonnx needs (Verilator, a C++ compiler) is missing or failed."""


class SimulationError(HwonnxError):
    """A simulation could not run or did not finish."""


class MismatchError(HwonnxError):
    """Hardware and golden model disagree; the message names the first differing layer and
    index."""


class SweepError(HwonnxError):
    """No point of a design-space sweep (``hwonnx explore``) succeeded; its outputs say why."""
