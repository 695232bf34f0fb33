"""Host steps: the float32 NumPy operators hwonnx runs on the host, before the accelerator's
input (pre-processing such as a mean/std normalization or an NHWC to NCHW ``Transpose``) or
after its output (``Softmax``, ``ArgMax``, ``TopK``, ...).

Each function takes one sample (its run-time inputs have the IR shape, whose leading axis has
size 1) and returns its outputs as a tuple; :func:`run_host` applies it to a batch sample by
sample, so an operator on axis 0 means what it means for one sample in ONNX. Both evaluators
(:func:`hwonnx.golden.evaluate` and :func:`hwonnx.ir.evaluate.evaluate_float`) call it."""

from typing import Callable, Mapping, Sequence

import numpy as np

from ..ir.graph import Node

__all__ = ["HOST_FUNCTIONS", "run_host"]


def _activation(y: np.ndarray, relu: bool = False, act_max=None) -> np.ndarray:
    if relu:
        y = np.maximum(y, np.float32(0))
    if act_max is not None:
        y = np.minimum(y, np.float32(act_max))
    return y


def _add(a, b, *, relu=False, act_max=None, **_):
    return (_activation(np.add(a, b, dtype=np.float32), relu, act_max),)


def _softmax(x, *, axis, **_):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True),)


def _log_softmax(x, *, axis, **_):
    shifted = x - x.max(axis=axis, keepdims=True)
    return (shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True)),)


def _argmax(x, *, axis, keepdims=1, select_last_index=0, **_):
    """ONNX ``ArgMax``: the first index of the largest value (the last with
    ``select_last_index``), int64."""
    if select_last_index:
        flipped = np.flip(x, axis=axis)
        index = x.shape[axis] - 1 - np.argmax(flipped, axis=axis)
    else:
        index = np.argmax(x, axis=axis)
    if keepdims:
        index = np.expand_dims(index, axis)
    return (index.astype(np.int64),)


def _topk(x, *, k, axis, largest=1, **_):
    """ONNX ``TopK``: the ``k`` largest (smallest) values along ``axis`` in order, and their
    int64 indices; among equal values the lower index comes first (a stable sort). The output
    is always sorted, which ``sorted=0`` (any order) permits."""
    order = np.argsort(-x if largest else x, axis=axis, kind="stable")
    index = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, index, axis=axis), index.astype(np.int64)


def _layernorm(x, scale, bias=None, *, axis, epsilon, **_):
    """ONNX ``LayerNormalization`` (stash type float32) over the axes from ``axis`` on."""
    axes = tuple(range(axis, x.ndim))
    x = np.asarray(x, np.float32)
    centered = x - x.mean(axis=axes, keepdims=True, dtype=np.float32)
    variance = (centered * centered).mean(axis=axes, keepdims=True, dtype=np.float32)
    y = centered / np.sqrt(variance + np.float32(epsilon)) * scale
    return ((y if bias is None else y + bias).astype(np.float32),)


def _concat(*xs, axis, relu=False, act_max=None, **_):
    """``Concat`` on the host: a token region's class token joined to the tokens."""
    return (_activation(np.concatenate(xs, axis=axis).astype(np.float32), relu, act_max),)


#: One function per host op: ``fn(*inputs, **attrs) -> tuple of outputs`` on one sample.
HOST_FUNCTIONS: "dict[str, Callable[..., tuple]]" = {
    "Add": _add,
    "Sub": lambda a, b, **_: (np.subtract(a, b, dtype=np.float32),),
    "Mul": lambda a, b, **_: (np.multiply(a, b, dtype=np.float32),),
    "Div": lambda a, b, **_: (np.divide(a, b, dtype=np.float32),),
    "Transpose": lambda x, *, perm, **_: (np.transpose(x, perm),),
    "Cast": lambda x, **_: (np.asarray(x).astype(np.float32),),
    "Identity": lambda x, **_: (x,),
    "Softmax": _softmax,
    "LogSoftmax": _log_softmax,
    "ArgMax": _argmax,
    "TopK": _topk,
    "LayerNorm": _layernorm,
    "Concat": _concat,
    "Gather": lambda x, *, axis, indices, **_: (np.take(x, list(indices), axis=axis),),
}


def run_host(node: Node, args: Sequence[np.ndarray], batched: Sequence[bool],
             types: Mapping) -> "tuple[np.ndarray, ...]":
    """Run host ``node`` on ``args`` sample by sample.

    ``batched[i]`` says whether ``args[i]`` is a run-time value (a batch along axis 0, one
    sample per index) or a constant (the same for every sample). Outputs get the dtype of
    their IR type (``types``: value name -> ``TensorType``)."""
    fn = HOST_FUNCTIONS[node.op]
    count = next(a.shape[0] for a, b in zip(args, batched) if b)
    per_sample = [fn(*[a[i:i + 1] if b else a for a, b in zip(args, batched)],
                     **dict(node.attrs)) for i in range(count)]
    outputs = []
    for index, name in enumerate(node.outputs):
        dtype = types[name].dtype
        if count == 0:
            outputs.append(np.zeros((0,) + tuple(types[name].shape[1:]), dtype))
        else:
            outputs.append(np.concatenate([r[index] for r in per_sample]).astype(dtype))
    return tuple(outputs)
