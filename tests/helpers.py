"""Helpers every kind of test uses (the helpers of one kind of test are in the other
``*_helpers.py`` modules)."""

import re

import pytest

__all__ = ["raises", "quiet"]


def raises(cls, message: str):
    """``pytest.raises(cls)`` that also checks the whole message: it must be ``message``
    exactly (not a pattern, not a part of it)."""
    return pytest.raises(cls, match="^" + re.escape(message) + "$")


def quiet(*_):
    """A ``log`` callback that drops the progress messages."""
