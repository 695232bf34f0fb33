"""Helpers of the tests that run the command line in process (``hwonnx.cli.main``)."""

import re

from hwonnx.cli import main

__all__ = ["run", "assert_user_error", "assert_only_error"]


def run(capsys, *argv) -> "tuple[int, str, str]":
    """``hwonnx <argv>`` in this process: its exit status, stdout and stderr."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_user_error(result, message: str):
    """Exit status 2, nothing on stdout, and stderr ending in exactly one line ``hwonnx:
    error: <message>`` (``message`` a pattern; after the progress lines), with no
    traceback."""
    code, out, err = result
    assert (code, out) == (2, ""), err
    assert "Traceback" not in err
    assert re.fullmatch(r"(?s)(.*\n)?hwonnx: error: " + message + r"\n", err), err


def assert_only_error(result, message: str):
    """:func:`assert_user_error` with nothing else on stderr: no progress line before it."""
    code, out, err = result
    assert (code, out) == (2, ""), err
    assert re.fullmatch(r"hwonnx: error: " + message + r"\n", err), err
    assert "Traceback" not in err
