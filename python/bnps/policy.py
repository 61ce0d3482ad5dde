"""The BN policy and gradient mode a job's --policy, --bn_policy and
--gradients name, resolved by the one rule bnps_server and bnps_worker use
(policy::ResolvePolicy, policy/policy.h) through libbnps.so's
bnps_resolve_policy. Standard library only (ctypes, no NumPy), so the
launcher (tools/bnps_launch.py) uses it under any python3.

    p = bnps.policy.resolve(bn_policy="async")
    p.gradients   # "sync"
    p.flags       # ["--bn_policy=async", "--gradients=sync"]

Without libbnps.so it raises ImportError saying how to build or install it;
there is no second implementation of the rule in Python.
"""

import collections
import ctypes
import json

from bnps import _library

_API_VERSION = 7  # bnps_resolve_policy

Resolved = collections.namedtuple("Resolved", [
    "bn_policy",       # "sync", "async", "recal" or "local"
    "gradients",       # "sync" or "async"
    "name",            # "async", or "bn_policy=async,gradients=sync"
    "flags",           # the flags that name the pair to the binaries
    "policies",        # every BN policy, as C++ lists them
    "gradient_modes",  # every gradient mode
])


def resolve(policy=None, bn_policy=None, gradients=None, library_dirs=()):
    """The pair the three flags' values name (None or "": not given):
    --bn_policy and --gradients win over what --policy implies and default
    to sync. bnps.errors.InvalidArgument (a ValueError) with the binaries'
    own message for an unknown name or a --policy that contradicts either;
    ImportError without libbnps.so (looked for first in `library_dirs`)."""
    lib = _library.open_library(_API_VERSION, library_dirs)
    fn = lib.bnps_resolve_policy
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_char_p] * 4 + [ctypes.c_size_t, ctypes.c_char_p,
                                          ctypes.c_size_t]
    out = ctypes.create_string_buffer(4096)
    err = ctypes.create_string_buffer(_library.ERR_LEN)
    code = fn(*[(v or "").encode() for v in (policy, bn_policy, gradients)],
              out, len(out), err, len(err))
    _library.check(lib, code, err)
    return Resolved(**json.loads(out.value.decode()))
