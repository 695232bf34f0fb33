"""The instruction encoding (fields, round trips, range errors) and the activation layout
(words of packed images and vectors)."""


import numpy as np
import pytest

from hwonnx.compiler import (FIELDS, LOOP_FIELDS, Op, decode, encode, instruction_width,
                             natural_placement, pack_words, unpack_words)
from hwonnx.isa import ACTX_FIELDS, ELTW_FIELDS, LOADP_FIELDS, LOADX_FIELDS

from helpers import raises
from compiler_helpers import ceil_div


# ISA --------------------------------------------------------------------------------------------

def test_fields_tile_the_instruction_word():
    width = instruction_width()
    assert width == sum(f.width for f in FIELDS)
    assert len({f.name for f in FIELDS}) == len(FIELDS)
    seen = 0
    for f in FIELDS:
        bits = encode(**{f.name: -1 if f.signed else (1 << f.width) - 1})
        assert bin(bits).count("1") == f.width
        assert bits & seen == 0                         # no two fields share a bit
        seen |= bits
    assert seen == (1 << width) - 1


@pytest.mark.parametrize("layout", [FIELDS, LOOP_FIELDS, ELTW_FIELDS, LOADX_FIELDS,
                                    LOADP_FIELDS, ACTX_FIELDS],
                         ids=["micro", "loop", "eltw", "loadx", "loadp", "actx"])
def test_encode_decode_round_trip(layout):
    rng = np.random.default_rng(0)
    own = {Op.LOOP: LOOP_FIELDS, Op.ELTW: ELTW_FIELDS, Op.LOADX: LOADX_FIELDS,
           Op.LOADP: LOADP_FIELDS, Op.LOADA: ACTX_FIELDS, Op.STOREA: ACTX_FIELDS}
    ops = [o for o in Op.NAMES if own.get(o, FIELDS) is layout]
    for _ in range(300):
        values = {}
        for f in layout:
            lo, hi = (-(1 << (f.width - 1)), (1 << (f.width - 1)) - 1) if f.signed \
                else (0, (1 << f.width) - 1)
            values[f.name] = int(rng.choice([lo, hi, int(rng.integers(lo, hi, endpoint=True))]))
        values["op"] = int(rng.choice(ops))
        word = encode(**values)
        assert 0 <= word < 1 << instruction_width()
        assert decode(word) == values


def test_missing_fields_encode_as_zero():
    assert decode(encode(op=Op.POST, count=7)) == {f.name: {"op": Op.POST, "count": 7}.get(
        f.name, 0) for f in FIELDS}


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.name)
def test_encode_range_errors(field):
    lo = -(1 << (field.width - 1)) if field.signed else 0
    hi = (1 << (field.width - 1)) - 1 if field.signed else (1 << field.width) - 1
    kind = "signed " if field.signed else ""
    for value in (lo - 1, hi + 1):
        with raises(ValueError, f"Instruction field {field.name}={value} does not fit "
                                f"{field.width} {kind}bits"):
            encode(**{field.name: value})
    assert decode(encode(**{field.name: lo}))[field.name] == lo
    assert decode(encode(**{field.name: hi}))[field.name] == hi


def test_encode_unknown_field():
    with pytest.raises(KeyError, match=r"^\"Unknown instruction fields \['bogus', 'zz'\]\"$"):
        encode(op=1, zz=1, bogus=2)


# layout -----------------------------------------------------------------------------------------

def lane(words, word, index, rows):
    assert 0 <= words[word] < 1 << (8 * rows)
    return int(np.int8(np.uint8((words[word] >> (8 * index)) & 0xFF)))


@pytest.mark.parametrize("rows", [3, 4, 8])
@pytest.mark.parametrize("shape", [(1, 5, 3, 4), (1, 8, 2, 2), (1, 1, 4, 3), (1, 11, 1, 1)])
def test_pack_unpack_image(rows, shape):
    rng = np.random.default_rng(rows * 100 + shape[1])
    values = rng.integers(-128, 128, shape).astype(np.int8)
    placement = natural_placement(17, shape, rows)
    _, c, h, w = shape
    cb = ceil_div(c, rows)
    assert (placement.base, placement.cb, placement.words) == (17, cb, h * w * cb)
    words = pack_words(values, placement, rows)
    assert len(words) == h * w * cb
    for y in range(h):
        for x in range(w):
            for ch in range(cb * rows):
                got = lane(words, (y * w + x) * cb + ch // rows, ch % rows, rows)
                assert got == (values[0, ch, y, x] if ch < c else 0)
    back = unpack_words(words, placement, rows)
    assert back.dtype == np.int8 and back.shape == shape
    np.testing.assert_array_equal(back, values)


@pytest.mark.parametrize("rows", [3, 8])
@pytest.mark.parametrize("k", [1, 8, 13])
def test_pack_unpack_vector(rows, k):
    values = np.random.default_rng(k).integers(-128, 128, (1, k)).astype(np.int8)
    placement = natural_placement(0, (1, k), rows)
    words = pack_words(values, placement, rows)
    assert len(words) == ceil_div(k, rows) == placement.words
    for i in range(ceil_div(k, rows) * rows):
        assert lane(words, i // rows, i % rows, rows) == (values[0, i] if i < k else 0)
    np.testing.assert_array_equal(unpack_words(words, placement, rows), values)


def test_flattened_placement_keeps_memory():
    rows = 4
    values = np.random.default_rng(9).integers(-128, 128, (1, 6, 3, 2)).astype(np.int8)
    image = natural_placement(0, values.shape, rows)
    flat = image.with_shape((1, 36))
    assert not flat.is_natural_image(rows) and image.is_natural_image(rows)
    words = pack_words(values, image, rows)
    assert pack_words(values.reshape(1, 36), flat, rows) == words
    np.testing.assert_array_equal(unpack_words(words, flat, rows), values.reshape(1, 36))
