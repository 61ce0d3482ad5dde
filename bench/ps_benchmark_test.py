"""ps_benchmark still runs and prints its tables (not how fast: that is the
benchmark's job). The grad table runs each system's reps in a child process
(this binary with --grad_child), which prints its rep times on one line.
"""

import os
import re
import subprocess
import unittest

BENCH = os.path.join(os.getcwd(), "bench", "ps_benchmark")
ROW = re.compile(r"^\| (\d+) \| (\d) \| ([\d+]+) \| (\S+) \| (\S+) \| (\S+) \|$")


def run(args, timeout=240):
    return subprocess.run([BENCH] + args, capture_output=True, text=True,
                          timeout=timeout)


class GradTableTest(unittest.TestCase):
    def test_quick_grad_table_has_every_row(self):
        r = run(["--tables=grad", "--quick"])
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = [ROW.match(line) for line in r.stdout.splitlines()]
        rows = [m.groups() for m in rows if m]
        self.assertEqual([(mb, s) for mb, s, *_ in rows],
                         [("1", "1"), ("16", "1"), ("64", "1"),
                          ("1", "2"), ("16", "2"), ("64", "2")], r.stdout)
        for mb, shards, keys, bnps, echo, ratio in rows:
            # Keys of at most 4 MB, spread over the shards.
            self.assertEqual(sum(int(k) for k in keys.split("+")),
                             max(1, int(mb) // 4))
            self.assertEqual(len(keys.split("+")), int(shards))
            self.assertGreater(float(bnps), 0, r.stdout)
            self.assertGreater(float(echo), 0, r.stdout)
            # The MB/s cells are rounded to integers, the ratio to 0.01.
            b, e = float(bnps), float(echo)
            self.assertAlmostEqual(float(ratio), b / e,
                                   delta=0.006 + b / e * (0.5 / b + 0.5 / e))

    def test_one_system_leaves_the_other_skipped(self):
        r = run(["--tables=grad", "--quick", "--systems=echo"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| 64 | 2 | 8+8 | skipped |", r.stdout)

    def test_grad_child_prints_its_rep_times(self):
        r = run(["--grad_child=echo,1,2,3"])
        self.assertEqual(r.returncode, 0, r.stderr)
        words = r.stdout.split()
        self.assertEqual(words[0], "reps", r.stdout)
        self.assertEqual(len(words), 4, r.stdout)
        self.assertTrue(all(float(w) > 0 for w in words[1:]), r.stdout)
        r = run(["--grad_child=bnps,1,1,2"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(r.stdout.split()), 3, r.stdout)

    def test_bad_grad_child_spec_is_one_clear_line(self):
        for spec in ["gloo,1,1,1", "echo,1,1", "echo,0,1,1", "echo,1,x,1"]:
            r = run(["--grad_child=" + spec])
            self.assertEqual(r.returncode, 2, spec)
            self.assertIn("is not bnps|echo,MB,S,REPS", r.stderr)
            self.assertEqual(r.stdout, "")


class BnTableTest(unittest.TestCase):
    def test_tcp_and_star_rows_with_their_ratio(self):
        # The raw-TCP barrier beside gRPC's, W = 1 and 2 (two processes that
        # wait for each other every round: a barrier that never answered
        # would hang the row, not pass).
        r = run(["--tables=bn", "--quick", "--systems=star,tcp",
                 "--channels=64", "--workers=1,2", "--rounds=1"])
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = [l for l in r.stdout.splitlines() if l.startswith("| ")]
        header = [c.strip() for c in lines[0].strip("|").split("|")]
        rows = [[c.strip() for c in l.strip("|").split("|")]
                for l in lines[1:]]
        self.assertEqual([row[:2] for row in rows], [["64", "1"], ["64", "2"]])
        col = header.index
        for row in rows:
            star = float(row[col("star p50")].rstrip("*"))
            tcp = float(row[col("tcp p50")].rstrip("*"))
            self.assertGreater(tcp, 0, r.stdout)
            self.assertLessEqual(tcp, float(row[col("tcp p99")].rstrip("*")))
            # The p50s are printed rounded (whole µs from 10 up, tenths
            # below) and the ratio from the unrounded values, to 2 places:
            # it must lie within what the rounded cells allow.
            def bounds(us):
                half = 0.5 if us >= 10 else 0.05
                return us - half, us + half
            star_lo, star_hi = bounds(star)
            tcp_lo, tcp_hi = bounds(tcp)
            printed = float(row[col("star/tcp")])
            self.assertGreaterEqual(printed, star_lo / tcp_hi - 0.005, r.stdout)
            self.assertLessEqual(printed, star_hi / tcp_lo + 0.005, r.stdout)
            self.assertEqual(row[col("bnps p50")], "skipped")
            self.assertEqual(row[col("bnps/tcp")], "-")

    def test_unknown_system_is_refused(self):
        r = run(["--tables=bn", "--systems=udp"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("star or tcp", r.stderr)


if __name__ == "__main__":
    unittest.main()
