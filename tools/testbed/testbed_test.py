"""The test bed itself (network namespaces need root; those tests skip,
saying why, without it; the loopback bed's run everywhere): hosts
reach each other at their own addresses, a client host reaches a server
host over its relayed link with the round trip asked for, one link is cut
while another works (an asymmetric partition), and a bed leaves no
namespace or process behind, also when its creator was SIGKILLed."""

import os
import signal
import socket
import subprocess
import sys
import time
import unittest
from unittest import mock

from tools.testbed import testbed

HERE = os.path.dirname(os.path.abspath(__file__))
WHY = testbed.unavailable()

# Runs inside a host: a round trip of 100-byte messages, `n` times, to
# IP:PORT; prints the smallest round trip in microseconds, or the error.
PING = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
best = None
try:
    for _ in range(int(sys.argv[3])):
        t = time.perf_counter()
        s.sendall(b"x" * 100)
        got = 0
        while got < 100:
            data = s.recv(100 - got)
            if not data:
                raise ConnectionError("closed")
            got += len(data)
        rtt = (time.perf_counter() - t) * 1e6
        best = rtt if best is None else min(best, rtt)
    print(int(best))
except OSError as e:
    print(type(e).__name__)
"""


@unittest.skipIf(WHY, f"no test bed here: {WHY}")
class TestbedTest(unittest.TestCase):
    def ping(self, bed, host, address, n=20, timeout=20):
        ip, port = address.split(":")
        r = bed.run(host, [sys.executable, "-c", PING, ip, port, str(n)],
                    capture_output=True, text=True, timeout=timeout)
        return r.stdout.strip() or r.stderr.strip()

    def start_echo(self, bed, host, port=7000):
        p = bed.popen(host, [sys.executable, os.path.join(HERE, "echo_server.py"),
                             bed.ip(host), str(port)], stdout=subprocess.PIPE,
                      text=True)
        self.assertEqual(p.stdout.readline().strip(), "ready")

    def check_links(self, bed):
        """Direct reach, a 2 ms link, an asymmetric cut and its healing."""
        self.start_echo(bed, 0)
        self.start_echo(bed, 1)
        # Directly, at each host's own address.
        self.assertTrue(self.ping(bed, 2, f"{bed.ip(0)}:7000").isdigit())
        links = bed.links(clients=[2], servers=[0, 1], ports=[7000],
                          rtt_us=2000)
        # Over the relay: at least the round trip asked for (load can
        # only add to it).
        rtt = self.ping(bed, 2, links.address(0, 7000))
        self.assertTrue(rtt.isdigit(), rtt)
        self.assertGreaterEqual(int(rtt), 2000)
        # Cut host 2 -> host 0 only: host 1 still answers.
        links.cut(2, 0, "rst")
        self.assertIn("Reset", self.ping(bed, 2, links.address(0, 7000)))
        self.assertTrue(self.ping(bed, 2, links.address(1, 7000)).isdigit())
        links.heal(2, 0)
        self.assertTrue(self.ping(bed, 2, links.address(0, 7000)).isdigit())
        self.assertRegex(links.stats(2), r"h0:conns=3,.* h1:conns=1,")

    def test_hosts_reach_each_other_directly_and_over_links(self):
        with testbed.Bed(3) as bed:
            self.check_links(bed)

    def test_two_beds_at_once_and_nothing_left_behind(self):
        with testbed.Bed(2) as a, testbed.Bed(2) as b:
            self.assertNotEqual(a.tag, b.tag)
            names = a.namespaces + b.namespaces
            self.assertTrue(set(names) <= set(testbed._namespaces()))
            self.start_echo(a, 0)  # still running at close
            pid = a.procs[-1].pid
        self.assertFalse(set(names) & set(testbed._namespaces()))
        self.assertFalse(os.path.exists(f"/proc/{pid}"))

    def test_a_sigkilled_creators_bed_is_swept_by_the_next(self):
        code = ("import sys, time; sys.path.insert(0, '.');"
                "from tools.testbed import testbed;"
                "b = testbed.Bed(1); print(b.tag, flush=True); time.sleep(60)")
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             text=True)
        tag = p.stdout.readline().strip()
        self.assertTrue(tag.startswith(testbed.PREFIX), tag)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        p.stdout.close()
        self.assertTrue(any(n.startswith(tag) for n in testbed._namespaces()))
        with testbed.Bed(1):
            pass
        self.assertFalse(any(n.startswith(tag) for n in testbed._namespaces()))

    def test_sigterm_removes_the_bed(self):
        code = ("import sys, time; sys.path.insert(0, '.');"
                "from tools.testbed import testbed;"
                "b = testbed.Bed(1); print(b.tag, flush=True); time.sleep(60)")
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             text=True)
        tag = p.stdout.readline().strip()
        os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=30)
        p.stdout.close()
        self.assertFalse(any(n.startswith(tag) for n in testbed._namespaces()))


class LoopbackBedTest(unittest.TestCase):
    """The same links on loopback hosts: no privileges needed, runs
    everywhere."""

    ping = TestbedTest.ping
    start_echo = TestbedTest.start_echo
    check_links = TestbedTest.check_links

    def test_links_on_loopback_hosts(self):
        with testbed.LoopbackBed(3) as bed:
            self.assertEqual(bed.kind, "loopback")
            self.assertNotEqual(bed.ip(0), bed.ip(1))
            self.check_links(bed)
            pids = [p.pid for p in bed.procs]
        for pid in pids:  # the echo servers and the relay: stopped, reaped
            self.assertFalse(os.path.exists(f"/proc/{pid}"), pid)

    def test_each_client_host_has_its_own_link_address(self):
        with testbed.LoopbackBed(3) as bed:
            links = bed.links(clients=[1, 2], servers=[0], ports=[7000])
            a, b = links.address(0, 7000, client=1), links.address(0, 7000, client=2)
            self.assertNotEqual(a, b)
            with self.assertRaisesRegex(ValueError, "client="):
                links.address(0, 7000)

    def test_a_live_bed_keeps_its_address_block(self):
        """Held by a bed of another process until that process ends, and by
        a bed of this one until it closes; never given out twice."""
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys\n"
             "from tools.testbed import testbed\n"
             "bed = testbed.LoopbackBed(1)\n"
             "print(bed.net, flush=True)\n"
             "sys.stdin.read()\n"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        try:
            theirs = int(child.stdout.readline())
            with mock.patch.object(testbed, "LOOPBACK_NETS", [theirs]):
                with self.assertRaisesRegex(RuntimeError, "held by a live bed"):
                    testbed.LoopbackBed(1)
                child.stdin.close()
                child.wait(timeout=20)
                with testbed.LoopbackBed(2) as mine:
                    self.assertEqual(mine.ip(1), f"127.{theirs}.0.2")
                    with self.assertRaisesRegex(RuntimeError, "held"):
                        testbed.LoopbackBed(1)
                with testbed.LoopbackBed(1) as again:
                    self.assertEqual(again.net, theirs)
        finally:
            if child.poll() is None:
                child.kill()  # by PID: started here
            child.wait()
            child.stdout.close()

    def test_open_bed_chooses_and_can_be_forced(self):
        bed, note = testbed.open_bed(1, "loopback")
        with bed:
            self.assertEqual(bed.kind, "loopback")
            self.assertIn("loopback", note)
        with self.assertRaisesRegex(ValueError, "no bed kind"):
            testbed.open_bed(1, "vm")
        bed, note = testbed.open_bed(1)
        with bed:
            if WHY:
                self.assertEqual(bed.kind, "loopback")
                self.assertIn(WHY, note)
            else:
                self.assertEqual((bed.kind, note), ("netns", None))
        if WHY:
            with self.assertRaisesRegex(RuntimeError, "namespace|ip|root"):
                testbed.open_bed(1, "netns")

    def test_a_namespace_bed_that_fails_half_built_falls_back(self):
        def broken(hosts):
            raise RuntimeError("ip link add ... type veth: Unknown device type")
        with mock.patch.object(testbed, "unavailable", lambda: None), \
                mock.patch.object(testbed, "Bed", broken):
            bed, note = testbed.open_bed(2)
            with bed:
                self.assertEqual(bed.kind, "loopback")
                self.assertIn("Unknown device type", note)
            with self.assertRaisesRegex(RuntimeError, "Unknown device type"):
                testbed.open_bed(2, "netns")


if __name__ == "__main__":
    unittest.main()
