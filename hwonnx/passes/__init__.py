"""Graph-to-graph passes and the pipeline that runs them."""

from .batchnorm_to_conv import BatchNormToConv
from .channel_shuffle import ChannelShuffle
from .fold_batchnorm import FoldBatchNorm
from .fold_pad import FoldPad
from .fold_scale import FoldScale
from .fold_transpose import FoldTranspose
from .fuse_bias import FuseBias
from .fuse_clip import FuseClip
from .fuse_relu import FuseRelu
from .pipeline import FLOAT_PIPELINE, Pass, PassContext, run_pipeline
from .remove_identity import RemoveIdentity

__all__ = [
    "FLOAT_PIPELINE", "Pass", "PassContext", "run_pipeline", "RemoveIdentity", "FoldBatchNorm",
    "FoldScale", "FuseBias", "FuseRelu", "FuseClip", "FoldPad", "BatchNormToConv",
    "FoldTranspose", "ChannelShuffle",
]
