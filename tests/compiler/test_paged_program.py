"""Paged programs (hwonnx/compiler/paging.py, LOADP in hdl/dma.py, the boot and page rules of
hdl/top.py): the program lives in the external memory and runs a page at a time in a program
memory of two pages, each next page copied while the one before runs; RTL bit-exact with
golden in exactly the predicted cycles, run after run, on the accelerator and through the
board top and its UART."""

from dataclasses import replace

import pytest

from hwonnx.api import build
from hwonnx.compiler import Op, encode_program
from hwonnx.compiler.artifact import load_program, save_program
from hwonnx.compiler.paging import PAGE, page_lengths, page_words, paged, truncated, unpaged
from hwonnx.compiler.sizing import sized
from hwonnx.config import ArchConfig
from hwonnx.errors import ModelError
from hwonnx.isa import decode, ext_words_per_instruction, fields_of

from compiler_helpers import streamed_model, streamed_samples
from helpers import quiet
from rtl_helpers import rtl_matches_golden
from tests.compiler.test_external_weights import CONFIG, board_top_cycles
from tests.compiler.test_loops import timed_as_expanded

#: The streamed model's 21 instructions in pages of 4: seven pages, five LOADPs.
PAGED = replace(CONFIG, prog_page=4, prog_depth=8)


@pytest.fixture(scope="module")
def result():
    return build(streamed_model(), None, config=PAGED, calib=streamed_samples(8), log=quiet)


@pytest.fixture(scope="module")
def plain():
    return build(streamed_model(), None, config=CONFIG, calib=streamed_samples(8), log=quiet)


def test_page_lengths_fill_every_page_but_the_last():
    assert page_lengths(21, 4) == [4, 3, 3, 3, 3, 3, 2]     # pages 1-5 begin with a LOADP
    assert page_lengths(8, 4) == [4, 4] and page_lengths(5, 4) == [4, 1]
    assert page_lengths(3, 4) == [3]
    for n in range(1, 60):
        for page in (2, 4, 8):
            lengths = page_lengths(n, page)
            loadps = max(0, len(lengths) - 2)
            assert sum(lengths) == n and all(1 <= x <= page for x in lengths)
            assert all(x + (1 <= k < len(lengths) - 1) == page
                       for k, x in enumerate(lengths[:-1]))
            assert page_words(n, page, 8) == max(n + loadps, 2 * page) * 7


def _pages(program) -> "list[dict]":
    """The instructions the start of ``program``'s external image holds, decoded."""
    per = ext_words_per_instruction(program.config.cols)
    ext = program.images["ext"]
    return [decode(sum(w << (64 * j) for j, w in enumerate(ext[i:i + per])))
            for i in range(0, len(program.instructions) * per, per)]


def _fields(program) -> "list[dict]":
    """``program``'s instructions as :func:`decode` gives them (unset fields 0)."""
    return [{f.name: i.fields.get(f.name, 0) for f in fields_of(i.op)}
            for i in program.instructions]


def test_the_pages_are_the_instructions_at_the_start_of_the_external_memory(result, plain):
    program, before = result.program, plain.program
    per = ext_words_per_instruction(8)
    assert per == 7                                     # 421 bits in words of 8 bytes
    ops = [i.op for i in program.instructions]
    assert len(ops) == 26 and ops.count(Op.LOADP) == 5
    for k in range(1, 6):                               # page k begins with page k + 1's LOADP
        loadp = program.instructions[4 * k]
        assert loadp.op == Op.LOADP
        assert (loadp["prog_addr"], loadp["ext_addr"]) == (4 * ((k + 1) % 2), 4 * (k + 1) * per)
        assert loadp["count"] == (2 if k == 5 else 4) * per
    # the image decodes back to the instructions; the weights follow, moved up by the pages
    region = 26 * per
    assert _pages(program) == _fields(program)
    assert program.images["ext"][region:] == before.images["ext"]
    assert [i["ext_addr"] - region for i in program.instructions if i.op == Op.LOADX] == \
        [i["ext_addr"] for i in before.instructions if i.op == Op.LOADX]
    assert unpaged(program).instructions == before.instructions
    assert encode_program(program) == []                # no initial contents: the boot loads it
    assert program.words["ext"] == before.words["ext"] + region


def test_a_paged_program_is_timed_as_its_expansion(result, plain):
    """The timing of the stored program (each walk from its nest's rows) is the cycle
    model's on the expanded program, with the LOADPs, LOADXs and the external memory's."""
    assert timed_as_expanded(result.program) and timed_as_expanded(plain.program)


def test_unpaged_is_the_inverse_of_paged(result, plain):
    program = result.program
    back = unpaged(program)
    assert back.instructions == plain.program.instructions
    assert back.images == plain.program.images
    assert back.placements.keys() == plain.program.placements.keys()
    again = paged(back)
    assert again.instructions == program.instructions and again.images == program.images
    assert [(layer.first, layer.last) for layer in again.layers] == \
        [(layer.first, layer.last) for layer in program.layers]


def test_a_truncated_paged_program_is_paged_again(result, plain):
    cut = truncated(result.program, 1)
    body = unpaged(cut).instructions
    assert body == truncated(plain.program, 1).instructions
    assert len(body) == 10 and [i.op for i in cut.instructions].count(Op.LOADP) == 1
    assert _pages(cut) == _fields(cut)
    assert cut.images["ext"][page_words(10, 4, 8):] == plain.program.images["ext"]


def test_a_build_folder_keeps_a_paged_program_and_checks_its_pages(result, tmp_path):
    save_program(result.program, tmp_path)
    loaded = load_program(tmp_path)
    assert loaded.instructions == result.program.instructions
    lines = (tmp_path / "ext.hex").read_text().split("\n")
    lines[7] = f"{int(lines[7], 16) ^ 1:016x}"          # one bit of the second instruction
    (tmp_path / "ext.hex").write_text("\n".join(lines))
    with pytest.raises(ModelError, match="the pages in ext.hex differ from the instructions"):
        load_program(tmp_path)


def test_a_long_program_with_an_external_memory_is_paged_when_sized():
    config = ArchConfig(ext_memory="ulx3s-sdram", ext_depth=1 << 20)
    words = {"act": 100, "wgt": 100, "par": 10, "prog": 2 * PAGE + 1, "acc": 64, "lut": 0,
             "ext": 1000}
    paged_config = sized(config, words)
    assert (paged_config.prog_page, paged_config.prog_depth) == (PAGE, 2 * PAGE)
    assert paged_config.ext_depth == 1 << (1000 + page_words(2 * PAGE + 1, PAGE, 8) - 1) \
        .bit_length()
    board = sized(config, words, block_depth=512)
    assert (board.prog_page, board.prog_depth) == (PAGE, 2 * PAGE)
    short = sized(config, {**words, "prog": 2 * PAGE})                  # fits two pages
    assert short.prog_page == 0
    assert sized(replace(config, ext_memory="", ext_depth=0), {**words, "ext": 0}).prog_page == 0
    assert sized(config, words, fixed=("prog",)).prog_page == 0


@pytest.mark.parametrize("changes, why", [
    (dict(prog_page=3, prog_depth=6), "power of two"),
    (dict(prog_page=4, prog_depth=16), "prog_depth twice"),
    (dict(prog_page=4, prog_depth=8, ext_memory="", ext_depth=0), "external memory"),
    (dict(prog_page=8192, prog_depth=16384), "at most 4096 for 8 columns"),
])
def test_a_paged_configuration_is_checked(changes, why):
    with pytest.raises(ValueError, match=why):
        replace(CONFIG, **changes)


@pytest.mark.rtl
def test_a_paged_program_runs_bit_exact_in_the_predicted_cycles(result):
    rtl_matches_golden(result, streamed_samples(2), 2)          # two runs: each boots its pages


@pytest.mark.rtl
def test_the_board_design_loads_the_paged_program_and_runs_over_the_uart(result):
    """The system top with the memory model outside: the host writes the external image (the
    program and the streamed weights) with WRITEX and nothing into the program memory; two
    samples' outputs equal golden, and the board counts the predicted cycles."""
    from hwonnx.boards.build import board_images

    assert board_images(result.program)["prog"] == []
    board_top_cycles(result)
