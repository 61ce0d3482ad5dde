"""bnps_relay on 127.0.0.1 (no namespaces needed): the delay is at least what
was asked, a byte stream keeps its order under jitter, FIN passes, a
blackhole holds bytes until the heal, rst resets open and new connections,
and bad commands and flags are refused."""

import os
import socket
import subprocess
import sys
import time
import unittest

from tools.testbed.testbed import RelayProcess, relay_path

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exactly(s, n):
    out = b""
    while len(out) < n:
        data = s.recv(n - len(out))
        if not data:
            break
        out += data
    return out


class RelayTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.echo_port = free_port()
        cls.echo = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "echo_server.py"), "127.0.0.1",
             str(cls.echo_port)], stdout=subprocess.PIPE, text=True)
        assert cls.echo.stdout.readline().strip() == "ready"

    @classmethod
    def tearDownClass(cls):
        cls.echo.kill()
        cls.echo.wait()

    def start_relay(self, *flags):
        self.port = free_port()
        relay = RelayProcess([
            relay_path(),
            f"--forward=l=127.0.0.1:{self.port}>127.0.0.1:{self.echo_port}",
            *flags])
        self.addCleanup(relay.close)
        return relay

    def test_each_direction_waits_the_delay(self):
        self.start_relay("--delay_us=1000")
        with connect(self.port) as s:
            rtts = []
            for _ in range(20):
                t = time.perf_counter()
                s.sendall(b"x" * 100)
                self.assertEqual(recv_exactly(s, 100), b"x" * 100)
                rtts.append(time.perf_counter() - t)
        # A lower bound: load can only add to it.
        self.assertGreaterEqual(min(rtts), 0.002)

    def test_jitter_keeps_the_byte_order(self):
        self.start_relay("--delay_us=50", "--jitter_us=500")
        payload = b"".join(b"%08d" % i for i in range(20000))
        with connect(self.port) as s:
            for i in range(0, len(payload), 1000):
                s.sendall(payload[i:i + 1000])
            s.shutdown(socket.SHUT_WR)
            self.assertEqual(recv_exactly(s, len(payload) + 1), payload)

    def test_end_of_file_crosses(self):
        self.start_relay("--delay_us=100")
        with connect(self.port) as s:
            s.sendall(b"bye")
            s.shutdown(socket.SHUT_WR)
            self.assertEqual(recv_exactly(s, 3), b"bye")
            self.assertEqual(s.recv(10), b"")  # the echo server's FIN

    def test_blackhole_holds_the_bytes_until_the_heal(self):
        relay = self.start_relay()
        with connect(self.port) as s:
            s.sendall(b"a")
            self.assertEqual(recv_exactly(s, 1), b"a")
            self.assertEqual(relay.command("cut l blackhole"), "ok")
            s.sendall(b"held")
            s.settimeout(0.3)
            with self.assertRaises(socket.timeout):
                s.recv(10)
            # A connection made during the cut is held too.
            late = connect(self.port)
            late.sendall(b"late")
            late.settimeout(0.3)
            with self.assertRaises(socket.timeout):
                late.recv(10)
            self.assertEqual(relay.command("heal l"), "ok")
            s.settimeout(10)
            late.settimeout(10)
            self.assertEqual(recv_exactly(s, 4), b"held")
            self.assertEqual(recv_exactly(late, 4), b"late")
            late.close()

    def test_rst_resets_open_and_new_connections_until_the_heal(self):
        relay = self.start_relay()
        with connect(self.port) as s:
            s.sendall(b"a")
            self.assertEqual(recv_exactly(s, 1), b"a")
            relay.command("cut l rst")
            with self.assertRaises(ConnectionResetError):
                s.recv(10)
        # A new connection is reset (when connect() returns, or after).
        with self.assertRaises((ConnectionResetError, BrokenPipeError)):
            with connect(self.port) as s:
                s.sendall(b"b")
                s.recv(10)
        relay.command("heal l")
        with connect(self.port) as s:
            s.sendall(b"c")
            self.assertEqual(recv_exactly(s, 1), b"c")
        self.assertRegex(relay.command("stats"), r"^l:conns=3,open=\d,up=2,down=2$")

    def test_bad_commands_are_refused(self):
        relay = self.start_relay()
        for line in ("cut l sideways", "cut nolink rst", "delay l -5",
                     "loss l 2", "fly"):
            with self.assertRaisesRegex(RuntimeError, "error"):
                relay.command(line)
        self.assertEqual(relay.command("delay * 10 5"), "ok")
        self.assertEqual(relay.command("loss l 0.5 1000"), "ok")

    def test_bad_forward_is_refused(self):
        r = subprocess.run([relay_path(), "--forward=l=127.0.0.1:1"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("is not LINK=LISTEN_IP:PORT>TARGET_IP:PORT", r.stderr)


if __name__ == "__main__":
    unittest.main()
