"""bnps for Python: the client of a bnps job's shard servers.

Most users want bnps.torch (SyncBatchNorm backed by bnps). This package also
holds bnps.Client (the client library's calls, float64 NumPy vectors in and
out), bnps.errors (the exceptions every call raises), bnps.launch (the worker id
and count from torchrun's, Kubeflow's or Slurm's variables) and bnps.cluster
(shard servers started from Python, for tests, examples and benchmarks).

The compiled part is libbnps.so, a plain C ABI (python/native/bnps_c.h)
that bnps._native loads with ctypes: inside the wheel, or built by `bazel
build //python:libbnps.so` for tools/bnps_python. See docs/pytorch.md.
"""

from bnps.errors import (BnpsError, DeadlineExceeded, FailedPrecondition,
                         InvalidArgument, NotFound, Unavailable)


def __getattr__(name):
    # bnps.Client loads the native library on first use, so that the pure
    # parts (bnps.errors, bnps.cluster) import without it.
    if name == "Client":
        from bnps.client import Client
        return Client
    raise AttributeError(f"module 'bnps' has no attribute {name!r}")

__all__ = ["BnpsError", "Client", "DeadlineExceeded", "FailedPrecondition",
           "InvalidArgument", "NotFound", "Unavailable"]
