"""The pass pipeline: one readable list, verified after every pass."""

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

from ..ir.graph import Graph, IRVerificationError
from .batchnorm_to_conv import BatchNormToConv
from .channel_shuffle import ChannelShuffle
from .fold_batchnorm import FoldBatchNorm
from .fold_pad import FoldPad
from .fold_transpose import FoldTranspose
from .fold_scale import FoldScale
from .fuse_bias import FuseBias
from .fuse_clip import FuseClip
from .fuse_relu import FuseRelu
from .remove_identity import RemoveIdentity

__all__ = ["PassContext", "Pass", "run_pipeline", "FLOAT_PIPELINE"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassContext:
    """Read-only inputs every pass may consult, plus debugging switches.

    Parameters
    ----------
    dump_dir : Path, optional
        Write the IR after each pass to ``<dump_dir>/<NN>-<pass name>.ir.txt``.
    skip : frozenset of str
        Names of passes to skip, for bisecting miscompiles.
    quantized : frozenset of str
        Values a pre-quantized model quantizes to int8 (QDQ / QOperator). The model's
        arithmetic rounds them, so a pass must not fold a node across one (a ``BatchNorm``
        after a quantized ``Conv`` output stays a layer of its own).
    """
    dump_dir: Path | None = None
    skip: frozenset[str] = frozenset()
    quantized: frozenset[str] = frozenset()


class Pass(Protocol):
    """A graph transformation: returns a new graph, or the same object if nothing changed."""
    name: str

    def __call__(self, graph: Graph, ctx: PassContext) -> Graph: ...


def run_pipeline(graph: Graph, passes: "Sequence[Pass]", ctx: PassContext) -> Graph:
    """Run ``passes`` in order, verifying the graph before the first and after each one.

    Raises
    ------
    IRVerificationError
        If a pass produces an ill-formed graph; the message names the pass.
    """
    graph.verify()
    if ctx.dump_dir is not None:
        ctx.dump_dir.mkdir(parents=True, exist_ok=True)
        (ctx.dump_dir / "00-input.ir.txt").write_text(repr(graph) + "\n")
    for index, p in enumerate(passes, start=1):
        if p.name in ctx.skip:
            log.info("skipping pass %s", p.name)
            continue
        new = p(graph, ctx)
        try:
            new.verify()
        except IRVerificationError as error:
            raise IRVerificationError(f"After pass '{p.name}': {error}") from error
        log.debug("pass %s: %d -> %d nodes", p.name, len(graph.nodes), len(new.nodes))
        if ctx.dump_dir is not None:
            (ctx.dump_dir / f"{index:02d}-{p.name}.ir.txt").write_text(repr(new) + "\n")
        graph = new
    return graph


#: The passes :func:`hwonnx.frontend.load_model` runs on every float graph.
#: ``channel-shuffle`` comes after ``fold-transpose`` (a Transpose that a ``Dense`` can take
#: into its weights costs nothing) and ``remove-identity`` (an ``Identity`` in a shuffle's
#: chain of layout nodes).
#: ``fold-pad`` and ``batchnorm-to-conv`` come before the fusions, so that the ``Conv``/``Dense``
#: they produce (or pad) still absorbs a following ``Add``, ``Relu`` or ``Clip``. ``fold-scale``
#: comes after ``fuse-bias`` (Keras's ``MatMul -> Add -> Mul -> Add``: the layer's bias ``Add``
#: first, then the scale node with the second ``Add`` in its bias) and before the activations.
FLOAT_PIPELINE: "list[Pass]" = [FoldTranspose(), RemoveIdentity(), ChannelShuffle(), FoldPad(),
                                FoldBatchNorm(), BatchNormToConv(), FuseBias(), FoldScale(),
                                FuseRelu(), FuseClip()]
