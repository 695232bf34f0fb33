"""``hwonnx build <bundled example>``: a bundled example's name stands for its model file and
its bundled calibration data, so the board quick start needs no files of the user's."""

import json

from hwonnx.cli import main


def test_build_bundled_example_by_name_for_icebreaker(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["build", "digits_cnn", "--board", "icebreaker", "-o", str(out)]) == 0
    _, err = capsys.readouterr()
    assert "Traceback" not in err
    board = json.loads((out / "board" / "hwonnx_board.json").read_text())
    assert board["board"] == "icebreaker"
    arch = json.loads((out / "arch.json").read_text())
    assert (arch["rows"], arch["cols"], arch["prog_width"]) == (4, 1, 64)
    assert "SB_SPRAM256KA" in (out / "board" / "hwonnx_top.il").read_text()


def test_a_name_that_is_neither_a_file_nor_an_example(tmp_path, capsys):
    assert main(["build", "digits_rnn", "-o", str(tmp_path / "out")]) == 2
    _, err = capsys.readouterr()
    assert err == "hwonnx: error: Cannot read model 'digits_rnn': No such file or directory\n"
