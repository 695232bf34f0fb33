"""Bundled example models for hwonnx (used by ``hwonnx demo``).

Two small models trained on scikit-learn's ``load_digits`` (8x8 grey images,
10 classes, pixels scaled to [0, 1]) ship with the package:

* ``digits_mlp`` -- input "image" [batch, 64] -> Gemm -> Relu -> Gemm -> "logits" [batch, 10]
* ``digits_cnn`` -- input "image" [batch, 1, 8, 8] -> Conv -> BatchNormalization -> Relu
  -> Conv(stride 2) -> Relu -> Flatten -> Gemm -> "logits" [batch, 10]

plus ``digits_data.npz`` with calibration and test data (see
:func:`load_digits_data`).  All three files are made by ``train_digits.py`` in
this folder; this module only locates and loads them and needs nothing beyond
NumPy (no torch, no scikit-learn).
"""

from __future__ import annotations

import pathlib

import numpy as np

__all__ = ["EXAMPLES", "EXAMPLES_DIR", "example_calibration", "example_path",
           "load_digits_data"]

#: The folder holding the bundled example files.
EXAMPLES_DIR: pathlib.Path = pathlib.Path(__file__).resolve().parent

#: Names of the bundled example models, accepted by :func:`example_path`.
EXAMPLES: tuple[str, ...] = ("digits_mlp", "digits_cnn")

_DATA_FILE = "digits_data.npz"


def example_path(name: str) -> pathlib.Path:
    """Return the path of the bundled ONNX model ``name``.

    ``example_path("digits_mlp")`` -> ``EXAMPLES_DIR / "digits_mlp.onnx"``.
    A trailing ``.onnx`` in ``name`` is accepted.

    Raises:
        KeyError: ``name`` is not one of :data:`EXAMPLES` (the message lists them).
    """
    key = name[: -len(".onnx")] if name.endswith(".onnx") else name
    if key not in EXAMPLES:
        raise KeyError(
            f"unknown example model {name!r}; known examples: {', '.join(EXAMPLES)}"
        )
    return EXAMPLES_DIR / f"{key}.onnx"


def example_calibration(name: str) -> dict[str, np.ndarray]:
    """The bundled calibration samples of example ``name``, keyed by its input name."""
    shape = (-1, 1, 8, 8) if example_path(name).stem == "digits_cnn" else (-1, 64)
    return {"image": load_digits_data()["calib"].reshape(shape)}


def load_digits_data() -> dict[str, np.ndarray]:
    """Load the bundled digits data as a dict of arrays.

    Keys:
        ``calib``: float32 [200, 64], training images for int8 calibration.
        ``test_images``: float32 [N_test, 64], held-out images in [0, 1].
        ``test_labels``: int64 [N_test], their classes 0..9.

    The images are flat rows of 64 pixels, as ``digits_mlp`` takes them;
    ``digits_cnn`` takes them reshaped with ``x.reshape(-1, 1, 8, 8)``.
    """
    with np.load(EXAMPLES_DIR / _DATA_FILE, allow_pickle=False) as npz:
        return {key: npz[key] for key in npz.files}
