"""Train and export hwonnx's bundled example models (scikit-learn ``load_digits``).

This script is the single source of every data file in ``hwonnx/examples/``:

* ``digits_mlp.onnx``  -- input "image" [batch, 64] float32
  -> Linear(64, 32) -> ReLU -> Linear(32, 10) -> output "logits" [batch, 10]
* ``digits_cnn.onnx``  -- input "image" [batch, 1, 8, 8] float32
  -> Conv2d(1, 8, 3, padding=1) -> BatchNorm2d(8) -> ReLU
  -> Conv2d(8, 16, 3, stride=2, padding=1) -> ReLU -> Flatten
  -> Linear(16*4*4, 10) -> output "logits" [batch, 10]
  (exported with ``do_constant_folding=False`` so that the BatchNormalization
  node stays in the graph: hwonnx folds it itself)
* ``digits_data.npz``  -- ``calib``       float32 [200, 64]   training images for calibration
                          ``test_images`` float32 [N_test, 64] held-out images
                          ``test_labels`` int64   [N_test]     their labels
  The CNN takes the same rows reshaped to [-1, 1, 8, 8].

Data: ``sklearn.datasets.load_digits()`` (shipped with scikit-learn, no
download), pixels divided by 16 to lie in [0, 1], split 75 % / 25 % with
``train_test_split(..., test_size=0.25, random_state=0, stratify=y)``.

Both models are exported with the legacy TorchScript exporter
(``dynamo=False``, opset 13, dynamic batch axis), their names are made C
identifiers (``fc1.weight`` -> ``fc1_weight``, ``/fc1/Gemm`` -> ``fc1_Gemm``,
as the ONNX IR requires; :func:`clean_names`), and they are checked with
``onnx.checker.check_model`` and evaluated on the test split with
onnxruntime; the accuracies are printed.

How to run (from the repository root)::

    pip install torch==2.13.0 scikit-learn   # only this script needs them
    python hwonnx/examples/train_digits.py   # writes into hwonnx/examples/
    python hwonnx/examples/train_digits.py --out-dir /tmp/x   # elsewhere
    python hwonnx/examples/train_digits.py --clean-names   # only rename, no training

``--clean-names`` rewrites the two ``.onnx`` files of ``--out-dir`` with
:func:`clean_names` and needs only the ``onnx`` package; the weights stay
bit-identical.

Everything is seeded (NumPy, torch, single CPU thread, deterministic
algorithms), so a re-run reproduces the same weights.  It takes a few seconds
on a 2-core CPU.

PyTorch is used ONLY by this script; nothing else in hwonnx imports it.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

import numpy as np

__all__ = ["clean_name", "clean_names", "main", "rename_file"]

SEED = 0
N_CALIB = 200
EPOCHS = 60
BATCH = 64
LR = 1e-2
OPSET = 13
HERE = pathlib.Path(__file__).resolve().parent


def load_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return ``x_train, x_test, y_train, y_test`` (float32 [N, 64] in [0, 1], int64)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=0.25, random_state=0, stratify=y
    )
    return (
        np.ascontiguousarray(x_tr),
        np.ascontiguousarray(x_te),
        np.ascontiguousarray(y_tr),
        np.ascontiguousarray(y_te),
    )


def build_models():
    """Return ``(mlp, cnn)``; named layers give readable ONNX tensor names."""
    from collections import OrderedDict

    import torch.nn as nn

    mlp = nn.Sequential(OrderedDict([
        ("fc1", nn.Linear(64, 32)),
        ("relu1", nn.ReLU()),
        ("fc2", nn.Linear(32, 10)),
    ]))
    cnn = nn.Sequential(OrderedDict([
        ("conv1", nn.Conv2d(1, 8, 3, padding=1)),
        ("bn1", nn.BatchNorm2d(8)),
        ("relu1", nn.ReLU()),
        ("conv2", nn.Conv2d(8, 16, 3, stride=2, padding=1)),
        ("relu2", nn.ReLU()),
        ("flatten", nn.Flatten()),
        ("fc", nn.Linear(16 * 4 * 4, 10)),
    ]))
    return mlp, cnn


def train(model, x: np.ndarray, y: np.ndarray, seed: int) -> None:
    """Mini-batch Adam with a cosine learning-rate schedule."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    xt = torch.from_numpy(x)
    yt = torch.from_numpy(y)
    opt = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS)
    model.train()
    for _ in range(EPOCHS):
        perm = torch.randperm(len(xt), generator=gen)
        for i in range(0, len(xt), BATCH):
            idx = perm[i : i + BATCH]
            opt.zero_grad()
            loss = F.cross_entropy(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
        sched.step()
    model.eval()


def export(model, example: np.ndarray, path: pathlib.Path) -> None:
    import warnings

    model.eval()
    with warnings.catch_warnings():
        # The legacy (TorchScript) exporter is chosen on purpose: it keeps the
        # graph plain (Gemm / Conv / BatchNormalization / Flatten) at opset 13.
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        _export(model, example, path)


def _export(model, example: np.ndarray, path: pathlib.Path) -> None:
    import torch

    torch.onnx.export(
        model,
        (torch.from_numpy(example),),
        str(path),
        dynamo=False,
        opset_version=OPSET,
        input_names=["image"],
        output_names=["logits"],
        dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
        do_constant_folding=False,
    )
    rename_file(path)


def clean_name(name: str) -> str:
    """``name`` as a C identifier: the exporter's ``/fc1/Gemm`` -> ``fc1_Gemm``,
    ``fc1.weight`` -> ``fc1_weight``; a C identifier is returned as it is."""
    name = re.sub(r"[^0-9A-Za-z_]", "_", name.lstrip("/"))
    return f"_{name}" if name[:1].isdigit() else name


def clean_names(model):
    """Rename, in place, every value (initializers, graph inputs and outputs, node inputs
    and outputs, value_info) and every node of ``model`` with :func:`clean_name`; return
    ``model``. Tensor contents are not touched. Raises ``ValueError`` if two names would
    become one."""
    graph = model.graph
    names = [graph.name, *(i.name for i in graph.initializer),
             *(v.name for v in (*graph.input, *graph.output, *graph.value_info)),
             *(v for node in graph.node for v in (*node.input, *node.output) if v)]
    values = {name: clean_name(name) for name in names}
    nodes = {node.name: clean_name(node.name) for node in graph.node if node.name}
    for kind, mapping in (("value", values), ("node", nodes)):
        if len(set(mapping.values())) != len(mapping):
            raise ValueError(f"clean_names: two {kind} names of the model become one")
    graph.name = values[graph.name]
    for item in (*graph.initializer, *graph.input, *graph.output, *graph.value_info):
        item.name = values[item.name]
    for node in graph.node:
        node.name = nodes.get(node.name, node.name)
        node.input[:] = [values[v] if v else v for v in node.input]
        node.output[:] = [values[v] if v else v for v in node.output]
    return model


def rename_file(path: pathlib.Path) -> None:
    """Rewrite the model at ``path`` with :func:`clean_names`."""
    import onnx

    model = onnx.load(str(path))
    onnx.save(clean_names(model), str(path))


def ort_accuracy(path: pathlib.Path, x: np.ndarray, y: np.ndarray) -> float:
    """Check the file with onnx and return its onnxruntime accuracy on (x, y)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    logits = sess.run(["logits"], {"image": x})[0]
    assert logits.shape == (len(x), 10), logits.shape
    return float((logits.argmax(axis=1) == y).mean())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=pathlib.Path, default=HERE,
                    help="where to write the .onnx and .npz files (default: this folder)")
    ap.add_argument("--clean-names", action="store_true",
                    help="only give the .onnx files in --out-dir C-identifier names (no "
                         "training; needs only onnx)")
    args = ap.parse_args(argv)
    out: pathlib.Path = args.out_dir
    if args.clean_names:
        for path in (out / "digits_mlp.onnx", out / "digits_cnn.onnx"):
            rename_file(path)
            print(f"renamed the values and nodes of {path}")
        return 0
    out.mkdir(parents=True, exist_ok=True)

    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    np.random.seed(SEED)
    torch.manual_seed(SEED)

    x_tr, x_te, y_tr, y_te = load_split()
    calib_idx = np.sort(np.random.default_rng(SEED).choice(len(x_tr), N_CALIB, replace=False))
    calib = x_tr[calib_idx]

    mlp, cnn = build_models()
    img = lambda a: a.reshape(-1, 1, 8, 8)  # noqa: E731

    train(mlp, x_tr, y_tr, seed=SEED)
    train(cnn, img(x_tr), y_tr, seed=SEED + 1)

    with torch.no_grad():
        for name, m, xin in (("mlp", mlp, x_te), ("cnn", cnn, img(x_te))):
            acc = (m(torch.from_numpy(xin)).argmax(1).numpy() == y_te).mean()
            print(f"torch      digits_{name}: test accuracy {acc:.4f}")

    mlp_path = out / "digits_mlp.onnx"
    cnn_path = out / "digits_cnn.onnx"
    export(mlp, x_te[:1], mlp_path)
    export(cnn, img(x_te[:1]), cnn_path)

    np.savez_compressed(
        out / "digits_data.npz",
        calib=calib.astype(np.float32),
        test_images=x_te.astype(np.float32),
        test_labels=y_te.astype(np.int64),
    )

    import onnx

    ok = True
    for path, xin in ((mlp_path, x_te), (cnn_path, img(x_te))):
        acc = ort_accuracy(path, xin, y_te)
        ops = [n.op_type for n in onnx.load(str(path)).graph.node]
        print(f"onnxruntime {path.stem}: test accuracy {acc:.4f} "
              f"({len(y_te)} images, {path.stat().st_size} bytes) ops={ops}")
        ok &= acc >= 0.95
    if "BatchNormalization" not in [n.op_type for n in onnx.load(str(cnn_path)).graph.node]:
        print("note: the exporter fused BatchNormalization into the convolution")
    print(f"wrote {mlp_path}, {cnn_path}, {out / 'digits_data.npz'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
