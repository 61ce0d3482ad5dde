"""Imported first by the tests here: where this interpreter has no torch
(Bazel may run a test with another python3, a pyenv one, say), re-runs the
test under Debian's /usr/bin/python3, which has python3-torch; fails, saying
so, where that has none either (tools/setup.sh installs it)."""

import os
import sys

DEBIAN_PYTHON = "/usr/bin/python3"

try:
    import torch  # noqa: F401
except ImportError:
    if os.path.realpath(sys.executable) != os.path.realpath(DEBIAN_PYTHON) \
            and os.path.exists(DEBIAN_PYTHON):
        os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON] + sys.argv)
    sys.exit("FAIL: torch cannot be imported by " + sys.executable +
             "; tools/setup.sh installs python3-torch")
