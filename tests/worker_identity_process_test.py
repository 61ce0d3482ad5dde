"""Per-worker tokens with the real binaries: bnps_server
--per_worker_tokens, each bnps_worker given only its own token file made by
bnps_worker_token. Both workers train with BN over TCP; a worker given
another's token stops at once with one line naming the refusal; bnps_status
reads the servers with the job token.
"""

import os
import subprocess
import sys
import tempfile
import unittest

RUNFILES = os.getcwd()
sys.path.insert(0, os.path.join(RUNFILES, "python"))
from bnps.cluster import parse_listening, server_command  # noqa: E402
SERVER = os.path.join(RUNFILES, "server", "bnps_server")
WORKER = os.path.join(RUNFILES, "worker", "bnps_worker")
STATUS = os.path.join(RUNFILES, "tools", "bnps_status")
TOKEN_TOOL = os.path.join(RUNFILES, "tools", "bnps_worker_token")
LAUNCHER = os.path.join(RUNFILES, "tools", "bnps_launch.py")
JOB_TOKEN = "identity-process-test-token-0123456789"


def run(args, timeout=120):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


class PerWorkerTokensTest(unittest.TestCase):
    def test_each_worker_with_its_own_token(self):
        with tempfile.TemporaryDirectory() as d:
            job = os.path.join(d, "job.token")
            with open(job, "w") as f:
                f.write(JOB_TOKEN + "\n")
            os.chmod(job, 0o600)  # a token others can read is refused
            tokens = []
            for w in range(2):
                r = run([TOKEN_TOOL, "--job_token_file=" + job,
                         "--worker=%d" % w])
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertRegex(r.stdout, r"^[0-9a-f]{64}\n$")
                path = os.path.join(d, "w%d.token" % w)
                with open(path, "w") as f:
                    f.write(r.stdout)
                os.chmod(path, 0o600)
                tokens.append(path)
            server = subprocess.Popen(
                server_command(  # bnps_status reads after the job
                    SERVER, port=0, bn_port=0, num_workers=2,
                    keep_serving=True,
                    flags=["--token_file=" + job, "--per_worker_tokens"]),
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            try:
                first = server.stdout.readline()
                self.assertIn("with per-worker tokens", first)
                address = parse_listening(first)

                def worker(w, token, *flags):
                    return [WORKER, "--servers=" + address, "--device=cpu",
                            "--data=synthetic", "--eval=none",
                            "--progress=none", "--num_workers=2",
                            "--worker=%d" % w, "--token_file=" + token,
                            "--max_steps=2"] + list(flags)

                # Worker 0 with worker 1's token: refused before it joins.
                bad = run(worker(0, tokens[1]))
                self.assertEqual(bad.returncode, 1, bad.stdout + bad.stderr)
                lines = bad.stderr.strip().splitlines()
                self.assertEqual(len(lines), 1, bad.stderr)
                # Without TLS its session is refused before any call: the
                # server proves itself under worker 0's key, which this
                # token cannot check.
                self.assertIn("another worker's own token for worker 0",
                              lines[0])
                # Each with its own: both train, BN over TCP.
                procs = [subprocess.Popen(worker(w, tokens[w]),
                                          stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True)
                         for w in range(2)]
                for w, p in enumerate(procs):
                    out, err = p.communicate(timeout=120)
                    self.assertEqual(p.returncode, 0, out + err)
                    self.assertIn("done: 2 steps", out)
                    self.assertIn("bnps worker %d: BN over TCP to shard 0 ("
                                  % w, out + err)
                # The operator's tools use the job token.
                s = run([STATUS, "--servers=" + address, "--token_file=" + job])
                self.assertEqual(s.returncode, 0, s.stderr)
            finally:
                server.terminate()
                server.wait(timeout=10)
                server.stdout.close()

    def test_the_launcher_hands_each_worker_its_own(self):
        with tempfile.TemporaryDirectory() as d:
            job = os.path.join(d, "job.token")
            with open(job, "w") as f:
                f.write(JOB_TOKEN + "\n")
            os.chmod(job, 0o600)  # a token others can read is refused
            out = os.path.join(d, "out")
            r = run([sys.executable, LAUNCHER, "--servers", "1", "--workers", "2",
                     "--bin_dir", RUNFILES, "--out_dir", out, "--timeout_s", "120",
                     "--token_file", job, "--per_worker_tokens",
                     "--data=synthetic", "--max_steps=2", "--eval=none"],
                    timeout=180)
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
            for w in range(2):
                with open(os.path.join(out, "worker%d.token" % w)) as f:
                    mine = f.read().strip()
                self.assertEqual(len(mine), 64)
                self.assertNotIn(JOB_TOKEN, open(os.path.join(
                    out, "w%d.log" % w)).read())
                expected = run([TOKEN_TOOL, "--job_token_file=" + job,
                                "--worker=%d" % w]).stdout.strip()
                self.assertEqual(mine, expected)


if __name__ == "__main__":
    unittest.main()
