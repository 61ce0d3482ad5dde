"""The console scripts of the wheel: `bnps-server`, `bnps-status` and
`bnps-host-bn` exec the bnps_server, bnps_status and bnps_host_bn binaries
packed in bnps/bin/ with the same arguments (same flags, same exit
statuses; --help lists them)."""

import os
import sys


def packaged_binary(name):
    """The path of bnps/bin/<name> inside the installed package, or None
    (a source checkout has none: Bazel builds them)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin",
                        name)
    return path if os.access(path, os.X_OK) else None


def _exec(name):
    path = packaged_binary(name)
    if path is None:
        sys.exit(f"{name}: not in this installation of bnps (install the "
                 f"wheel, or build it with `bazel build //:{name}`)")
    os.execv(path, [path] + sys.argv[1:])


def server():
    _exec("bnps_server")


def status():
    _exec("bnps_status")


def host_bn():
    _exec("bnps_host_bn")
