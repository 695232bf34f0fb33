"""ONNX IR conformance, external tensor data: a location relative to the model file, offset,
length and checksum read as given; absolute locations, '..', symbolic links out of the model's
folder, value fields next to external data, and missing or short files refused by tensor name
("External Tensor Data")."""

import hashlib
import os

import numpy as np
import onnx
import onnx.external_data_helper
import pytest
from onnx import helper, numpy_helper

from hwonnx.errors import ModelError
from hwonnx.frontend import load_model

from helpers import raises
from spec_helpers import check_against_ort, make_model, rand

RULE = "(ONNX IR: external data MUST give a file name relative to the model file)"


def save_external(folder, location="weights.bin", **kw):
    """Save a Gemm + Constant model with all tensors (also the Constant's) in ``location``."""
    model = make_model([helper.make_node("Constant", [], ["c"], name="const",
                                         value=numpy_helper.from_array(rand(1, 2, seed=4))),
                        helper.make_node("Gemm", ["x", "w", "b"], ["g"], name="fc"),
                        helper.make_node("Add", ["g", "c"], ["y"])],
                       {"x": [1, 3]}, {"y": [1, 2]}, {"w": rand(3, 2), "b": rand(2)}, **kw)
    path = folder / "model.onnx"
    os.makedirs(os.path.dirname(folder / location), exist_ok=True)
    onnx.external_data_helper.convert_model_to_external_data(
        model, all_tensors_to_one_file=True, location=location, size_threshold=0,
        convert_attribute=True)
    onnx.save_model(model, path)
    return model, path


def edit(path, tensor="w", **entries):
    """Rewrite ``tensor``'s external_data entries in the saved model (None deletes one)."""
    model = onnx.load(path, load_external_data=False)
    target = next(t for t in model.graph.initializer if t.name == tensor)
    info = {e.key: e.value for e in target.external_data}
    info.update(entries)
    del target.external_data[:]
    for key, value in info.items():
        if value is not None:
            target.external_data.add(key=key, value=str(value))
    onnx.save_model(model, path)
    return model


def test_external_data_with_offsets_is_read(tmp_path):
    model, path = save_external(tmp_path)
    stored = onnx.load(path, load_external_data=False)
    offsets = {t.name: {e.key: e.value for e in t.external_data}.get("offset")
               for t in stored.graph.initializer}
    assert offsets["w"] != offsets["b"]                   # one file, several tensors
    graph = check_against_ort(path)
    np.testing.assert_array_equal(graph.constants[graph.nodes[0].inputs[1]], rand(3, 2))


def test_location_in_a_subfolder_and_checksum(tmp_path):
    model, path = save_external(tmp_path, location="data/weights.bin")
    digest = hashlib.sha1((tmp_path / "data" / "weights.bin").read_bytes()).hexdigest()
    edit(path, checksum=digest)
    check_against_ort(path)
    edit(path, checksum="0" * 40)
    with raises(ModelError, f"Initializer 'w' has external data file 'data/weights.bin' with "
                f"SHA1 {digest}, but the model gives checksum {'0' * 40}"):
        load_model(path)


@pytest.mark.parametrize("location, why", [
    ("/etc/passwd", "which is absolute"),
    ("../weights.bin", "which leaves the model's folder"),
    ("data/../../weights.bin", "which leaves the model's folder"),
])
def test_unsafe_locations_are_refused(tmp_path, location, why):
    _, path = save_external(tmp_path)
    edit(path, location=location)
    with raises(ModelError, f"Initializer 'w' has external data location '{location}', {why} "
                f"{RULE}"):
        load_model(path)


def test_symbolic_link_out_of_the_folder_is_refused(tmp_path):
    inner = tmp_path / "model"
    inner.mkdir()
    _, path = save_external(inner)
    outside = tmp_path / "secret.bin"
    (inner / "weights.bin").rename(outside)
    (inner / "weights.bin").symlink_to(outside)
    with raises(ModelError, f"Initializer 'w' has external data location 'weights.bin', which "
                f"leads out of the model's folder through a symbolic link {RULE}"):
        load_model(path)


def test_missing_and_short_files_name_the_tensor(tmp_path):
    _, path = save_external(tmp_path)
    data = (tmp_path / "weights.bin").read_bytes()
    (tmp_path / "weights.bin").write_bytes(data[:30])
    offset = int(next(e.value for t in onnx.load(path, load_external_data=False)
                      .graph.initializer if t.name == "b" for e in t.external_data
                      if e.key == "offset"))
    with raises(ModelError, f"Initializer 'b' needs bytes {offset} to {offset + 8} of external "
                f"data file 'weights.bin', which has only 30 bytes"):
        load_model(path)
    (tmp_path / "weights.bin").unlink()
    with raises(ModelError, "Initializer 'w' cannot read its external data file 'weights.bin': "
                "No such file or directory"):
        load_model(path)


@pytest.mark.parametrize("entries, message", [
    (dict(length=12), "Initializer 'w' has external data length 12, but its dims [3, 2] need "
     "24 bytes"),
    (dict(offset="-8"), "Initializer 'w' has external data offset '-8'; it must be a "
     "non-negative integer"),
    (dict(location=None), f"Initializer 'w' stores its data externally but gives no location "
     f"{RULE}"),
])
def test_malformed_external_data_entries(tmp_path, entries, message):
    _, path = save_external(tmp_path)
    edit(path, **entries)
    with raises(ModelError, message):
        load_model(path)


def test_external_tensor_must_not_use_value_fields(tmp_path):
    _, path = save_external(tmp_path)
    model = onnx.load(path, load_external_data=False)
    model.graph.initializer[0].float_data.extend([0.0] * 6)
    onnx.save_model(model, path)
    with raises(ModelError, "Initializer 'w' stores its data externally and must not also use "
                "the value fields, but sets float_data (ONNX IR: external tensors MUST NOT use "
                "the value fields)"):
        load_model(path)


def test_external_data_needs_a_model_file(tmp_path):
    _, path = save_external(tmp_path)
    with raises(ModelError, "Initializer 'w' stores its data in 'weights.bin', relative to the "
                "model file, but the model was not read from a file; load it from its path"):
        load_model(path.read_bytes())


def test_constant_attribute_data_is_external_too(tmp_path):
    model, path = save_external(tmp_path)
    stored = onnx.load(path, load_external_data=False)
    assert stored.graph.node[0].attribute[0].t.data_location == onnx.TensorProto.EXTERNAL
    (tmp_path / "weights.bin").write_bytes((tmp_path / "weights.bin").read_bytes()[:-4])
    with raises(ModelError, "Attribute 'value' of node 'const' needs bytes 32 to 40 of "
                "external data file 'weights.bin', which has only 36 bytes"):
        load_model(path)
