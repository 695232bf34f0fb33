"""Model zoo: ONNX models of published architectures, built in code with seeded random weights.

:mod:`hwonnx.zoo.mlperf_tiny` holds the four MLPerf Tiny v1.0 reference architectures
(ResNet-8, DS-CNN, MobileNetV1-0.25, the anomaly-detection autoencoder), plus
:func:`count_macs` and :func:`random_inputs`; :mod:`hwonnx.zoo.exporters` holds small networks
laid out the way tf2onnx and PyTorch export them (:data:`EXPORTER_STYLE`).
"""

from .exporters import EXPORTER_STYLE
from .mlperf_tiny import (MLPERF_TINY, autoencoder, count_macs, ds_cnn, mobilenet_v1_025,
                          random_inputs, resnet8)

__all__ = ["EXPORTER_STYLE", "MLPERF_TINY", "autoencoder", "count_macs", "ds_cnn", "mobilenet_v1_025",
           "random_inputs", "resnet8"]
