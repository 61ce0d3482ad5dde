"""Finding and opening libbnps.so (python/native/bnps_c.h) with ctypes, and
its error convention; standard library only, so that the calls that need no
NumPy (bnps.policy) work where there is none. Internal.

Where the library is looked for: $BNPS_NATIVE_LIB, the directories `first`
a caller names (the launcher's <bin_dir>/python), beside this file (the
wheel), then libbnps.so in each entry of sys.path (tools/bnps_python puts
bazel-bin/python there; Bazel tests have it in their runfiles).
"""

import ctypes
import os
import sys

from bnps import errors

LIB_NAME = "libbnps.so"
ERR_LEN = 4096


class Error(RuntimeError):
    """A failed call: args (code: int, code_name: str, message: str)."""


def find(first=()):
    """The path of libbnps.so; ImportError saying how to get one if none."""
    candidates = [os.environ.get("BNPS_NATIVE_LIB")]
    candidates += [os.path.join(d, LIB_NAME) for d in first]
    candidates.append(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                   LIB_NAME))
    candidates += [os.path.join(p or os.getcwd(), LIB_NAME) for p in sys.path]
    for c in candidates:
        if c and os.path.isfile(c):
            return c
    raise ImportError(
        "bnps: no " + LIB_NAME + " (the native client library). Install "
        "the wheel (pip install dist/bnps-*.whl), or build it with `bazel "
        "build //python:libbnps.so` and run with tools/bnps_python "
        "(docs/pytorch.md).")


def open_library(api_version, first=()):
    """libbnps.so opened (RTLD_LOCAL: its dependencies stay private), with
    C ABI version `api_version` or later; ImportError when there is none,
    it cannot be loaded (a library it needs is missing) or it is older."""
    path = find(first)
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(f"bnps: cannot load {path}: {e}") from e
    if lib.bnps_api_version() < api_version:
        raise ImportError(f"bnps: {path} has C ABI version "
                          f"{lib.bnps_api_version()}, this needs "
                          f"{api_version} or later")
    lib.bnps_status_name.restype = ctypes.c_char_p
    lib.bnps_status_name.argtypes = [ctypes.c_int]
    return lib


def check(lib, code, err):
    """Raises the bnps.errors class of a call's status `code` (its message
    in the ctypes buffer `err`) unless it is 0."""
    if code != 0:
        raise errors.from_native(Error(
            code, lib.bnps_status_name(code).decode(),
            err.value.decode("utf-8", "replace")))
