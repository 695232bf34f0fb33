"""Read the values of ``--override-initializer NAME=file.npy`` options."""

import os
import re

import numpy as np

from ..errors import UsageError

__all__ = ["read_overrides"]


def read_overrides(specs: "list[str]") -> "dict[str, np.ndarray]":
    """Parse ``NAME=file.npy`` specs and load each array (no pickles).

    The result is meant for ``load_model(..., override_initializers=...)``, which checks that
    each name is an initialized graph input and that shape and dtype match.

    Raises
    ------
    UsageError
        If a spec is not ``NAME=file.npy``, names a value twice, or its file cannot be read.
    """
    overrides: "dict[str, np.ndarray]" = {}
    for spec in specs:
        match = re.fullmatch(r"([^=]+)=(.+)", spec)
        if not match:
            raise UsageError(f"--override-initializer must be NAME=file.npy, not '{spec}'")
        name, path = match.groups()
        if name in overrides:
            raise UsageError(f"--override-initializer gives '{name}' twice")
        try:
            overrides[name] = np.load(os.fspath(path), allow_pickle=False)
        except OSError as error:
            raise UsageError(f"Cannot read the override for '{name}' from '{path}': "
                             f"{error.strerror or error}") from error
        except ValueError as error:
            raise UsageError(f"Cannot read the override for '{name}' from '{path}': it is not "
                             f"a .npy array ({error})") from error
    return overrides
