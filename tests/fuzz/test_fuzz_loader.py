"""Loader fuzzing: truncated files, flipped bytes, random protobuf fields, random field values
and absurd dimensions and sizes. hwonnx must raise its own error (or read the model) every time:
never another exception, a hang or an allocation beyond its limits. Seeded and bounded."""

import contextlib
import io
import os
import random
import re
import resource
import signal
import time

import numpy as np
import onnx
import onnx.external_data_helper
import pytest
from google.protobuf.descriptor import FieldDescriptor
from onnx import helper, numpy_helper

from hwonnx.cli import main
from hwonnx.errors import HwonnxError
from hwonnx.frontend import load_model

from spec_helpers import make_model, rand
from tests.frontend.test_frontend_limits import conv_model

SEED = 20261121
MUTATIONS = 3000
PER_CALL_SECONDS = 10
MEMORY_HEADROOM = 3 << 30            # a load may not grow the address space by more than this


def seed_models() -> "list[onnx.ModelProto]":
    cnn = make_model([
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["r", "shape"], ["f"]),
        helper.make_node("Gemm", ["f", "g", "gb"], ["y"], name="fc", transB=1)],
        {"x": ["N", 2, 4, 4]}, {"y": ["N", 3]},
        {"w": rand(2, 2, 3, 3), "b": rand(2), "zero": np.array(0, np.int64),
         "axes": np.array([0], np.int64), "minus1": np.array([-1], np.int64),
         "g": rand(3, 32), "gb": rand(3)}, producer_name="fuzz", doc_string="seed")
    helper.set_model_props(cnn, {"model_author": "fuzz"})
    then = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", onnx.TensorProto.FLOAT, None)])
    branches = make_model([
        helper.make_node("Constant", [], ["cond"], value=numpy_helper.from_array(np.array(1))),
        helper.make_node("If", ["cond"], ["h"], then_branch=then, else_branch=other),
        helper.make_node("Relu", ["h"], ["y"])], {"x": [1, 3]}, {"y": [1, 3]},
        {"w": rand(3, 3)})
    function = helper.make_function("local", "F", ["a", "w"], ["b"], [
        helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node("Relu", ["m"], ["b"])],
        [helper.make_opsetid("", 17)])
    local = make_model([helper.make_node("F", ["x", "w"], ["y"], domain="local")],
                       {"x": [1, 3]}, {"y": [1, 3]}, {"w": rand(3, 3)},
                       opsets=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                       functions=[function])
    sparse = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [1, 3]},
                        {"y": [1, 2]}, opset=9, ir=4)
    sparse.graph.sparse_initializer.append(helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "w"),
        numpy_helper.from_array(np.array([0, 5], np.int64)), [3, 2]))
    return [cnn, branches, local, sparse]


# Mutations ----------------------------------------------------------------------------------

INTS = [0, 1, -1, 2, 3, 7, 13, 255, 1 << 31, (1 << 31) - 1, 1 << 40, (1 << 62), -(1 << 62)]
STRINGS = ["", "x", "y", "w", "N", "ai.onnx", "local", "../../etc/passwd", "/abs", "a" * 300,
           "If", "Loop", "Relu", "\u00e9t\u00e9", "1bad name"]


def random_value(rng: random.Random, field: FieldDescriptor):
    if field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
        text = rng.choice(STRINGS)
        return text.encode() if field.type == FieldDescriptor.TYPE_BYTES else text
    if field.type == FieldDescriptor.TYPE_ENUM:
        return rng.choice([v.number for v in field.enum_type.values] + [0])
    if field.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return rng.choice([0.0, -1.0, 1e30, float("nan"), float("inf")])
    value = rng.choice(INTS)
    cpp = field.cpp_type
    if cpp == FieldDescriptor.CPPTYPE_BOOL:
        return bool(value)
    if cpp in (FieldDescriptor.CPPTYPE_UINT32, FieldDescriptor.CPPTYPE_UINT64):
        return abs(value) % (1 << (32 if cpp == FieldDescriptor.CPPTYPE_UINT32 else 64))
    bits = 32 if cpp == FieldDescriptor.CPPTYPE_INT32 else 64
    return max(min(value, (1 << (bits - 1)) - 1), -(1 << (bits - 1)))


def mutate_message(rng: random.Random, message, depth: int = 0) -> None:
    """Change one field somewhere in ``message`` (descending at random)."""
    fields = message.DESCRIPTOR.fields
    field = rng.choice(fields)
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if field.is_repeated:
            items = getattr(message, field.name)
            if field.message_type.GetOptions().map_entry:
                return
            if items and rng.random() < 0.7 and depth < 6:
                mutate_message(rng, rng.choice(items), depth + 1)
            elif items and rng.random() < 0.5:
                del items[rng.randrange(len(items))]
            elif items:
                items.add().CopyFrom(rng.choice(items))
            else:
                items.add()
        elif depth < 6:
            mutate_message(rng, getattr(message, field.name), depth + 1)
    elif field.is_repeated:
        items = getattr(message, field.name)
        if items and rng.random() < 0.5:
            items[rng.randrange(len(items))] = random_value(rng, field)
        else:
            items.append(random_value(rng, field))
    else:
        setattr(message, field.name, random_value(rng, field))


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def random_field(rng: random.Random) -> bytes:
    number, wire = rng.randrange(1, 40), rng.choice([0, 1, 2, 5])
    payload = {0: varint(rng.choice([0, 1, 1 << 40])), 1: rng.randbytes(8), 5: rng.randbytes(4),
               2: varint(n := rng.randrange(0, 12)) + rng.randbytes(n)}[wire]
    return varint(number << 3 | wire) + payload


def mutate(rng: random.Random, model: onnx.ModelProto) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:                                   # structured: one or more field values
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        for _ in range(rng.randrange(1, 4)):
            mutate_message(rng, copy)
        return copy.SerializeToString()
    if kind == 1:                                   # absurd dims and sizes
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        dims = [rng.choice([1 << 20, 1 << 31, 1 << 40, -5, 0]) for _ in range(rng.randrange(1, 4))]
        targets = [*copy.graph.initializer, *[v.type.tensor_type.shape for v in
                                                (*copy.graph.input, *copy.graph.output)]]
        target = rng.choice(targets)
        if isinstance(target, onnx.TensorProto):
            target.dims[:] = dims
        else:
            for dim, size in zip(target.dim, dims):
                dim.Clear()
                dim.dim_value = size
        return copy.SerializeToString()
    data = model.SerializeToString()
    if kind == 2:
        return data[:rng.randrange(len(data))]
    if kind == 3:
        data = bytearray(data)
        for _ in range(rng.randrange(1, 9)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data)
    if kind == 4:
        at = rng.randrange(len(data))
        return data[:at] + random_field(rng) + data[at:]
    return data + b"".join(random_field(rng) for _ in range(rng.randrange(1, 5)))


# The tests ----------------------------------------------------------------------------------

class _Timeout(Exception):
    pass


@contextlib.contextmanager
def limits():
    """Bound each load in time (SIGALRM) and the process's address space (RLIMIT_AS)."""
    def expire(signum, frame):
        raise _Timeout()

    previous = signal.signal(signal.SIGALRM, expire)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as stream:
        in_use = int(stream.read().split()[0]) * resource.getpagesize()
    cap = in_use + MEMORY_HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY
                                            else min(cap, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_loader_raises_only_hwonnx_errors():
    rng = random.Random(SEED)
    models = seed_models()
    for model in models:
        load_model(model)                           # every seed is a valid model
    outcomes = {"read": 0, "refused": 0}
    started = time.monotonic()
    with limits():
        for index in range(MUTATIONS):
            data = mutate(rng, models[index % len(models)])
            signal.setitimer(signal.ITIMER_REAL, PER_CALL_SECONDS)
            try:
                load_model(data)
                outcomes["read"] += 1
            except HwonnxError:
                outcomes["refused"] += 1
            except _Timeout:
                pytest.fail(f"mutation {index} (seed {SEED}) hung for {PER_CALL_SECONDS} s")
            except BaseException as error:
                pytest.fail(f"mutation {index} (seed {SEED}) raised {type(error).__name__}: "
                            f"{error}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    assert outcomes["refused"] > MUTATIONS // 2 and outcomes["read"] > 0, outcomes
    assert time.monotonic() - started < 60


def test_external_data_entries_raise_only_hwonnx_errors(tmp_path):
    rng = random.Random(SEED + 1)
    model = seed_models()[0]
    onnx.external_data_helper.convert_model_to_external_data(
        model, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    onnx.save_model(model, tmp_path / "model.onnx")
    (tmp_path / "sub").mkdir()
    values = {"location": ["weights.bin", "sub/../weights.bin", "../weights.bin", "/etc/hosts",
                           ".", "sub", "missing.bin", "model.onnx", "weights.bin\0"],
              "offset": ["0", "8", "-1", "x", str(1 << 62), ""],
              "length": ["0", "4", "24", str(1 << 62), "1e3"],
              "checksum": ["", "0" * 40, "zz"]}
    with limits():
        for index in range(200):
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            tensor = rng.choice(list(copy.graph.initializer))
            for _ in range(rng.randrange(1, 4)):
                key = rng.choice(list(values))
                entries = [e for e in tensor.external_data if e.key != key]
                del tensor.external_data[:]
                tensor.external_data.extend(entries)
                tensor.external_data.add(key=key, value=rng.choice(values[key]))
            path = tmp_path / f"m{index % 2}.onnx"
            onnx.save_model(copy, path)
            signal.setitimer(signal.ITIMER_REAL, PER_CALL_SECONDS)
            try:
                load_model(path)
            except HwonnxError:
                pass
            except BaseException as error:
                pytest.fail(f"external data mutation {index} raised {type(error).__name__}: "
                            f"{error}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)


# The command line (``hwonnx inspect``, wired in hwonnx/cli.py by the lead) ------------------

def run_cli(*argv):
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main([str(a) for a in argv])
    return code, stdout.getvalue(), stderr.getvalue()


def test_cli_inspect_of_a_corrupt_file_is_one_error_line(tmp_path):
    data = seed_models()[0].SerializeToString()
    path = tmp_path / "broken.onnx"
    path.write_bytes(data[: len(data) // 3])
    code, stdout, stderr = run_cli("inspect", path)
    assert code == 2 and stdout == ""
    assert re.fullmatch(r"hwonnx: error: Cannot read model '.*broken\.onnx': it is not an ONNX "
                        r"model \(.*\)\n", stderr), stderr


def test_cli_inspect_of_a_valid_file(tmp_path):
    path = tmp_path / "cnn.onnx"
    onnx.save(seed_models()[0], path)
    code, stdout, stderr = run_cli("inspect", path)
    assert code == 0 and stderr == ""
    assert stdout.startswith("Model: cnn.onnx\n  IR version:    8\n")


def test_cli_inspect_refuses_small_hostile_files_in_one_line(tmp_path):
    pads = np.array([0, 0, 3000, 3000, 0, 0, 3000, 3000], np.int64)
    models = {
        "pad_bomb": make_model([helper.make_node("Pad", ["x", "pp"], ["xp"], mode="constant"),
                                helper.make_node("Conv", ["xp", "w"], ["c"]),
                                helper.make_node("GlobalAveragePool", ["c"], ["gp"]),
                                helper.make_node("Flatten", ["gp"], ["y"])],
                               {"x": [1, 2, 4, 4]}, {"y": [1, 2]},
                               {"pp": pads, "w": np.ones((2, 2, 3, 3), np.float32)}),
        "dilation": conv_model([1, 2, 8, 8], (4, 2, 3, 3), pads=[1] * 4, dilations=[50, 50]),
        "input_dim0": conv_model([1, 2, 8, 0], (4, 2, 3, 3), pads=[1] * 4),
        "auto_pad": conv_model([1, 2, 5, 5], (2, 2, 3, 3), auto_pad="VALID", pads=[1] * 4),
        "digits": seed_models()[0],
    }
    del models["digits"].graph.initializer[0].dims[:]
    models["digits"].graph.initializer[0].dims.extend([1 << 62] * 300)
    paths = []
    for name, model in models.items():
        paths.append(tmp_path / f"{name}.onnx")
        onnx.save(model, paths[-1])
    os.mkfifo(tmp_path / "fifo.onnx")
    paths += [tmp_path / "fifo.onnx", "/dev/zero"]
    with limits():
        for path in paths:
            signal.setitimer(signal.ITIMER_REAL, PER_CALL_SECONDS)
            try:
                code, stdout, stderr = run_cli("inspect", path)
            except _Timeout:
                pytest.fail(f"hwonnx inspect {path} took more than {PER_CALL_SECONDS} s")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            assert code == 2 and stdout == "", (path, code, stderr)
            assert re.fullmatch(r"hwonnx: error: [^\n]+\n", stderr) and len(stderr) < 1000, \
                (path, stderr)
