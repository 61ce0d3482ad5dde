"""tests/sharding.py: every test method runs in exactly one shard, class
fixtures still run, and the status file tells Bazel the module shards."""

import os
import tempfile
import unittest
from unittest import mock

from tests import sharding

RAN = []


class A(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        RAN.append("A.setUpClass")

    def test_1(self):
        RAN.append("A.test_1")

    def test_2(self):
        RAN.append("A.test_2")

    def test_3(self):
        RAN.append("A.test_3")


class B(unittest.TestCase):
    def test_1(self):
        RAN.append("B.test_1")


def suite():
    loader = unittest.TestLoader()
    return unittest.TestSuite([loader.loadTestsFromTestCase(A),
                               loader.loadTestsFromTestCase(B)])


def run(tests):
    del RAN[:]
    result = unittest.TestResult()
    tests.run(result)
    return list(RAN), result


class ShardingTest(unittest.TestCase):
    def test_each_method_runs_in_exactly_one_shard(self):
        for total in (1, 2, 3, 5):
            seen = []
            for index in range(total):
                ran, result = run(sharding.shard(suite(), index, total))
                self.assertTrue(result.wasSuccessful(), result.errors)
                methods = [r for r in ran if "test_" in r]
                if any(m.startswith("A.") for m in methods):
                    self.assertEqual(ran[0], "A.setUpClass", ran)
                seen += methods
            self.assertEqual(sorted(seen), ["A.test_1", "A.test_2", "A.test_3",
                                            "B.test_1"], total)

    def test_load_tests_reads_bazels_variables_and_touches_the_status_file(self):
        with tempfile.TemporaryDirectory() as d:
            status = os.path.join(d, "status")
            env = {"TEST_TOTAL_SHARDS": "2", "TEST_SHARD_INDEX": "1",
                   "TEST_SHARD_STATUS_FILE": status}
            with mock.patch.dict(os.environ, env):
                tests = sharding.load_tests(unittest.TestLoader(), suite(), None)
            self.assertTrue(os.path.exists(status))
            self.assertEqual(sorted(".".join(t.id().split(".")[-2:]) for t in tests),
                             ["A.test_2", "B.test_1"])

    def test_one_shard_or_none_runs_everything(self):
        with mock.patch.dict(os.environ, {}, clear=True):
            tests = sharding.load_tests(unittest.TestLoader(), suite(), None)
        self.assertEqual(tests.countTestCases(), 4)


if __name__ == "__main__":
    unittest.main()
