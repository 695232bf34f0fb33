"""What a build and a run give back: :class:`BuildResult` (``hwonnx build``, ``load_build``)
and :class:`SimResult` (``hwonnx sim``, ``hwonnx run``). A leaf: it imports no hwonnx module
that runs anything."""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .compiler.program import Program
from .ir import Graph

__all__ = ["BuildResult", "SimResult"]


@dataclass
class BuildResult:
    out_dir: "Path | None"
    graph: Graph            # the integer graph (golden model input)
    program: Program        # the program; of a segmented build, its first segment's
    report: dict
    #: A segmented build's programs, one per segment in order (``docs/architecture.md``,
    #: "Host steps and program segments"); empty for a build of one program.
    segments: "tuple[Program, ...]" = ()

    @property
    def programs(self) -> "tuple[Program, ...]":
        """The build's programs in order: its segments', or its one program."""
        return self.segments or (self.program,)


@dataclass
class SimResult:
    outputs: "dict[str, np.ndarray]"      # graph output name -> [S, ...] in the model's type
    #: int8 value the accelerator outputs -> [S, ...], before dequantization, in the order of
    #: ``Program.outputs`` (of a segmented build: every segment's, in order)
    int_values: "dict[str, np.ndarray]"
    cycles: "list[int]"                   # per sample (empty for the golden model)
    predicted_cycles: int
    macs: int
    pes: int
    cycles_per_second: float = 0.0        # all clock cycles over the simulator's wall time
    #: The same over the simulation alone, from the testbench's start to its end: without the
    #: start-up of the simulator process and the loading of the Verilator model
    #: (``startup_seconds``), which dominate short runs.
    steady_cycles_per_second: float = 0.0
    startup_seconds: float = 0.0
    #: Of a segmented build: per segment, the cycles of each sample (``cycles`` is their sum
    #: per sample) and the predicted cycles (``predicted_cycles`` is their sum).
    segment_cycles: "list[list[int]]" = field(default_factory=list)
    segment_predicted: "list[int]" = field(default_factory=list)

    @property
    def int_outputs(self) -> np.ndarray:
        """The int8 output of a model with one accelerator output (else see ``int_values``)."""
        if len(self.int_values) != 1:       # a caller that handles one output only: a bug
            raise ValueError(f"The model has {len(self.int_values)} accelerator outputs; "
                             f"use SimResult.int_values")
        return next(iter(self.int_values.values()))

    @property
    def utilization(self) -> float:
        if not self.cycles:
            return 0.0
        return self.macs / (float(np.mean(self.cycles)) * self.pes)
