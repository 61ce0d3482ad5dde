"""Bazel's test sharding for a unittest module (`shard_count` in BUILD).

A module that imports `load_tests` from here runs, in shard i of n, the
test methods whose position in the sorted list of test ids is i modulo n,
and tells Bazel it shards (TEST_SHARD_STATUS_FILE). Outside Bazel, or with
one shard, it runs everything:

    from tests.sharding import load_tests  # noqa: F401  (unittest's hook)

A class's setUpClass runs in each shard that has one of its methods.
Standard library only.
"""

import os
import unittest


def _cases(suite):
    for test in suite:
        if isinstance(test, unittest.TestSuite):
            yield from _cases(test)
        else:
            yield test


def shard(tests, index, total):
    """The tests of `tests` (a TestSuite) that shard `index` of `total`
    runs, as a flat TestSuite."""
    cases = sorted(_cases(tests), key=lambda t: t.id())
    return unittest.TestSuite(t for i, t in enumerate(cases) if i % total == index)


def load_tests(loader, tests, pattern):  # noqa: ARG001  (unittest's signature)
    """unittest's load_tests protocol: this shard's part of the module."""
    status = os.environ.get("TEST_SHARD_STATUS_FILE")
    if status:
        with open(status, "a"):
            pass
    total = int(os.environ.get("TEST_TOTAL_SHARDS", "1"))
    if total <= 1:
        return tests
    return shard(tests, int(os.environ.get("TEST_SHARD_INDEX", "0")), total)
