"""Unit tests of bnps.cluster's pure parts (no servers, no torch): the one
parser of a server's "listening on HOST:PORT" line."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles

from bnps.cluster import parse_listening  # noqa: E402


class ParseListeningTest(unittest.TestCase):
    def test_ipv4_and_names(self):
        self.assertEqual(parse_listening(
            "bnps_server: shard 0 of 2, job 'j', policy sync, 2 workers, "
            "listening on 127.0.0.1:7000\n"), "127.0.0.1:7000")
        self.assertEqual(parse_listening("listening on node-3.example:41"),
                         "node-3.example:41")

    def test_ipv6_keeps_its_brackets(self):
        self.assertEqual(parse_listening("x, listening on [::1]:7001"),
                         "[::1]:7001")
        self.assertEqual(parse_listening("listening on [fe80::1%eth0]:9\n"),
                         "[fe80::1%eth0]:9")

    def test_first_line_of_a_log_wins(self):
        log = ("starting\nbnps_host_bn: for 2 workers, listening on "
               "10.0.0.2:7200\nlater: listening on 10.0.0.9:1\n")
        self.assertEqual(parse_listening(log), "10.0.0.2:7200")

    def test_no_address(self):
        for text in (None, "", "listening on", "listening on 127.0.0.1",
                     "listening on 127.0.0.1:70x0", "listening on [::1]"):
            self.assertIsNone(parse_listening(text), text)


if __name__ == "__main__":
    unittest.main()
