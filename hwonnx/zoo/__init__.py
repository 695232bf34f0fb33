"""Model zoo: ONNX models of published architectures, built in code with seeded random weights.

:mod:`hwonnx.zoo.mlperf_tiny` holds the four MLPerf Tiny v1.0 reference architectures
(ResNet-8, DS-CNN, MobileNetV1-0.25, the anomaly-detection autoencoder), plus
:func:`count_macs` and :func:`random_inputs`; :mod:`hwonnx.zoo.imagenet` holds ResNet-18,
MobileNetV2 and 256x256 YOLO-style and U-Net models for the external memory;
:mod:`hwonnx.zoo.exporters` holds small networks laid out the way tf2onnx and PyTorch export
them (:data:`EXPORTER_STYLE`).
"""

from .exporters import EXPORTER_STYLE
from .imagenet import IMAGENET, mobilenet_v2, resnet18, unet_tiny, yolo_tiny
from .mlperf_tiny import (MLPERF_TINY, autoencoder, count_macs, ds_cnn, mobilenet_v1_025,
                          random_inputs, resnet8)

__all__ = ["EXPORTER_STYLE", "IMAGENET", "MLPERF_TINY", "mobilenet_v2", "resnet18", "unet_tiny",
           "yolo_tiny", "autoencoder", "count_macs", "ds_cnn", "mobilenet_v1_025",
           "random_inputs", "resnet8"]
