"""Unit tests of bnps.cluster's pure parts (no servers, no torch): the one
builder of bnps_server command lines and the one parser of a server's
"listening on HOST:PORT" line."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles

from bnps.cluster import (parse_listening, server_args,  # noqa: E402
                          server_command)


class ServerCommandTest(unittest.TestCase):
    def test_each_option_given_becomes_its_flag_in_order(self):
        self.assertEqual(
            server_command("/bin/bnps_server", shard=1, num_shards=2,
                           num_workers=4, policy="recal", job="j",
                           host="127.0.0.1", port=0, bn_port=0, bn_unix=True,
                           checkpoint_dir="/ck/shard1", keep_serving=True,
                           flags=["--staleness=2"]),
            ["/bin/bnps_server", "--host=127.0.0.1", "--port=0", "--shard=1",
             "--num_shards=2", "--num_workers=4", "--policy=recal", "--job=j",
             "--checkpoint_dir=/ck/shard1", "--bn_port=0",
             "--bn_unix_socket=auto", "--keep_serving", "--staleness=2"])

    def test_options_left_out_are_not_passed(self):
        self.assertEqual(server_command(), [])
        self.assertEqual(server_command("s", port=7000, shard=0),
                         ["s", "--port=7000", "--shard=0"])
        self.assertEqual(server_command(bn_port=-1), ["--bn_port=-1"])

    def test_a_resolved_pair_goes_as_its_flags(self):
        self.assertEqual(
            server_command(num_workers=2, policy=["--bn_policy=async",
                                                  "--gradients=sync"]),
            ["--num_workers=2", "--bn_policy=async", "--gradients=sync"])

    def test_a_flag_replaces_the_option_of_its_name(self):
        cmd = server_command("s", port=0, bn_port=0, bn_unix=True,
                             keep_serving=True,
                             flags=["--port=7001", "--bn_unix_socket=/tmp/x",
                                    "--keep_serving"])
        self.assertEqual(cmd, ["s", "--bn_port=0", "--port=7001",
                               "--bn_unix_socket=/tmp/x", "--keep_serving"])

    def test_tls_keeps_bn_on_the_grpc_stream(self):
        cmd = server_command(port=0, bn_port=0, bn_unix=True,
                             flags=["--tls_cert=/c.pem", "--tls_key=/k.pem"])
        self.assertEqual(cmd, ["--port=0", "--tls_cert=/c.pem",
                               "--tls_key=/k.pem"])

    def test_bn_on_the_grpc_stream_takes_no_unix_socket(self):
        # The server's Unix socket needs its raw-TCP listener.
        self.assertEqual(server_command(bn_port=0, bn_unix=True,
                                        flags=["--bn_port=-1"]),
                         ["--bn_port=-1"])
        self.assertEqual(server_command(bn_port=-1, bn_unix=True),
                         ["--bn_port=-1"])
        self.assertEqual(server_command(bn_port=0, bn_unix=True,
                                        flags=["--bn_port=7100"]),
                         ["--bn_unix_socket=auto", "--bn_port=7100"])

    def test_local_cluster_servers(self):
        self.assertEqual(
            server_args(0, 1, 2),
            ["--host=127.0.0.1", "--port=0", "--shard=0", "--num_shards=1",
             "--num_workers=2", "--policy=sync", "--job=bnps", "--bn_port=0",
             "--bn_unix_socket=auto"])
        self.assertNotIn("--bn_unix_socket=auto",
                         server_args(0, 1, 2, bn_unix=False))


class ParseListeningTest(unittest.TestCase):
    def test_ipv4_and_names(self):
        self.assertEqual(parse_listening(
            "bnps_server: shard 0 of 2, job 'j', policy sync, 2 workers, "
            "listening on 127.0.0.1:7000\n"), "127.0.0.1:7000")
        self.assertEqual(parse_listening("listening on node-3.example:41"),
                         "node-3.example:41")

    def test_the_servers_own_lines(self):
        # bnps_server's and bnps_host_bn's first lines, as they print them.
        self.assertEqual(parse_listening(
            "bnps_server: shard 1 of 2, job 'bnps', policy "
            "bn_policy=async,gradients=sync, 3 workers, listening on "
            "[::1]:41234"), "[::1]:41234")
        self.assertEqual(parse_listening(
            "bnps_host_bn: for 2 workers, listening on 127.0.0.1:7200\r\n"),
            "127.0.0.1:7200")

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

    def test_shell_scripts_read_it_through_the_module(self):
        import subprocess
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "server.log")
            with open(path, "w") as f:
                f.write("bnps_server: shard 0 listening on [::1]:7001\n")
            env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(
                os.path.abspath(sys.modules["bnps.cluster"].__file__))))
            run = lambda *args: subprocess.run(  # noqa: E731
                [sys.executable, "-m", "bnps.cluster", *args], env=env,
                capture_output=True, text=True, timeout=60)
            r = run("listening", path)
            self.assertEqual((r.returncode, r.stdout), (0, "[::1]:7001\n"))
            with open(path, "w") as f:
                f.write("starting\n")
            self.assertEqual(run("listening", path).returncode, 1)
            self.assertEqual(run("listening", path + ".gone").returncode, 1)
            self.assertEqual(run("ports").returncode, 2)


if __name__ == "__main__":
    unittest.main()
