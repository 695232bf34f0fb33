"""The golden model: the bit-exact specification of the accelerator's integer arithmetic."""

from .evaluate import evaluate
from .im2col import conv_output_size, im2col
from .ops import (GOLDEN_OPS, HOST_OPS, accumulate_bound, dequantize, qadd, qavgpool,
                  qconcat, qconv, qdense, qeltwise, quantize, requantize, softmax)
from .transposed import qconv_transpose

__all__ = ["GOLDEN_OPS", "HOST_OPS", "accumulate_bound", "conv_output_size", "dequantize",
           "evaluate", "im2col", "qadd", "qavgpool", "qconcat", "qconv", "qconv_transpose",
           "qdense", "qeltwise", "quantize", "requantize", "softmax"]
