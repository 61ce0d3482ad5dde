"""bnps_server, bnps_worker and bnps_status configured from the environment.

As in a container: every flag from a BNPS_* variable, the worker's id from
Kubernetes' JOB_COMPLETION_INDEX, the servers by DNS name (localhost). A flag
on the command line beats its variable; an unknown BNPS_ variable gets one
warning line naming it, a bad value exit status 2 naming it; --help names
the variables. Real processes on 127.0.0.1 (util/env_flags.h).
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

RUNFILES = os.getcwd()  # Bazel runs tests in the runfiles tree of the workspace
sys.path.insert(0, os.path.join(RUNFILES, "python"))
from bnps.cluster import parse_listening  # noqa: E402
SERVER = os.path.join(RUNFILES, "server", "bnps_server")
WORKER = os.path.join(RUNFILES, "worker", "bnps_worker")
STATUS = os.path.join(RUNFILES, "tools", "bnps_status")
TOKEN = "env-process-test-token-0123456789"


def clean_env(**variables):
    """The test's environment without BNPS_ and Kubernetes variables, plus these."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("BNPS_") and k != "JOB_COMPLETION_INDEX"}
    env.update({k: str(v) for k, v in variables.items()})
    return env


def run(args, env, timeout=60):
    return subprocess.run(args, env=env, capture_output=True, text=True,
                          timeout=timeout)


class Server:
    """A bnps_server on a free port of 127.0.0.1, stopped on exit."""

    def __init__(self, args, env):
        self.proc = subprocess.Popen([SERVER] + args, env=env,
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.first_line = self.proc.stdout.readline()
        address = parse_listening(self.first_line)
        if not address or not address.startswith("127.0.0.1:"):
            self.proc.kill()
            rest = self.proc.communicate(timeout=30)[0]
            raise AssertionError("server did not start: " + self.first_line + rest)
        self.port = int(address.rsplit(":", 1)[1])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()


class FromEnvironmentTest(unittest.TestCase):
    def test_a_job_runs_from_variables_alone(self):
        with tempfile.TemporaryDirectory() as out:
            token = os.path.join(out, "token")
            with open(token, "w") as f:
                f.write(TOKEN + "\n")
            os.chmod(token, 0o600)  # a token others can read is refused
            server_env = clean_env(
                BNPS_PORT=0, BNPS_JOB="envjob", BNPS_NUM_WORKERS=2,
                BNPS_SHARD=0, BNPS_NUM_SHARDS=1, BNPS_POLICY="sync",
                BNPS_TOKEN_FILE=token)
            with Server([], server_env) as server:
                self.assertIn("shard 0 of 1, job 'envjob', policy sync, "
                              "2 workers", server.first_line)
                workers = []
                for index in range(2):
                    env = clean_env(
                        JOB_COMPLETION_INDEX=index,
                        BNPS_SERVERS=f"localhost:{server.port}",
                        BNPS_JOB="envjob", BNPS_NUM_WORKERS=2,
                        BNPS_TOKEN_FILE=token, BNPS_DATA="synthetic",
                        BNPS_MAX_STEPS=3, BNPS_BATCH_SIZE=8,
                        BNPS_TRAIN_EXAMPLES=64, BNPS_TEST_EXAMPLES=32,
                        BNPS_PROGRESS="none", BNPS_EVAL="all",
                        BNPS_REPORT=os.path.join(out, f"worker{index}.json"))
                    workers.append(subprocess.Popen(
                        [WORKER], env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True))
                outputs = [w.communicate(timeout=240)[0] for w in workers]
                for index, (w, output) in enumerate(zip(workers, outputs)):
                    self.assertEqual(w.returncode, 0, output)
                    # The id came from JOB_COMPLETION_INDEX (two workers with
                    # one id could not both register).
                    self.assertIn(f"bnps_worker {index}/2: connecting to job "
                                  f"'envjob' at localhost:{server.port}", output)
                    self.assertRegex(output, r"test accuracy \d\.\d{4}")
                    report = json.load(open(os.path.join(out, f"worker{index}.json")))
                    self.assertEqual(report["steps"], 3)

    def test_flags_beat_variables(self):
        env = clean_env(BNPS_PORT=0, BNPS_JOB="from-env", BNPS_SHARD=1,
                        BNPS_NUM_SHARDS=2, BNPS_NUM_WORKERS=3)
        with Server(["--job=from-flag", "--shard=0"], env) as server:
            self.assertIn("shard 0 of 2, job 'from-flag', policy sync, 3 workers",
                          server.first_line)

    def test_the_workers_flag_and_variable_beat_the_job_index(self):
        # No server listens on port 1: the worker prints its id and stops.
        base = dict(BNPS_SERVERS="127.0.0.1:1", BNPS_NUM_WORKERS=4,
                    BNPS_CONNECT_TIMEOUT_S=0.2, BNPS_DATA="synthetic",
                    JOB_COMPLETION_INDEX=3)
        for extra_env, args, want in [({}, [], 3),
                                      ({"BNPS_WORKER": 1}, [], 1),
                                      ({"BNPS_WORKER": 1}, ["--worker=2"], 2)]:
            r = run([WORKER] + args, clean_env(**base, **extra_env))
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn(f"bnps_worker {want}/4: connecting", r.stdout,
                          (extra_env, args))

    def test_an_unknown_variable_is_a_warning_naming_it(self):
        for binary in (SERVER, WORKER):
            r = run([binary, "--help"], clean_env(BNPS_NUM_WORKRES=2))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("warning: BNPS_NUM_WORKRES", r.stderr)

    def test_a_bad_value_is_an_error_naming_the_variable(self):
        r = run([SERVER], clean_env(BNPS_PORT="seven"))
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("BNPS_PORT=seven", r.stderr)
        r = run([WORKER], clean_env(JOB_COMPLETION_INDEX="x",
                                    BNPS_SERVERS="127.0.0.1:1"))
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("JOB_COMPLETION_INDEX", r.stderr)

    def test_a_pair_checkpoints_cannot_restore_is_refused(self):
        # sync BN with stale-synchronous gradients: workers would resume at
        # different steps after a restart (docs/reliability.md).
        with tempfile.TemporaryDirectory() as d:
            r = run([SERVER, "--port=0", "--host=127.0.0.1"],
                    clean_env(BNPS_BN_POLICY="sync", BNPS_GRADIENTS="async",
                              BNPS_CHECKPOINT_DIR=d))
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("--bn_policy=sync and --gradients=async", r.stderr)

    def test_status_only_warns_about_other_binaries_variables(self):
        # As in `kubectl exec` into a server's container.
        r = run([STATUS, "--help"], clean_env(BNPS_PORT=7000, BNPS_SHARD=1))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("warning: BNPS_PORT", r.stderr)
        self.assertIn("warning: BNPS_SHARD", r.stderr)

    def test_help_names_each_flags_variable(self):
        for binary, wanted in [
                (SERVER, ["BNPS_PORT", "BNPS_TOKEN_FILE", "BNPS_SHARD=from-hostname"]),
                (WORKER, ["BNPS_SERVERS", "BNPS_NUM_WORKERS", "JOB_COMPLETION_INDEX"]),
                (STATUS, ["BNPS_SERVERS", "BNPS_TIMEOUT_MS"])]:
            r = run([binary, "--help"], clean_env())
            self.assertEqual(r.returncode, 0, r.stderr)
            for text in wanted:
                self.assertIn(text, r.stdout, binary)


if __name__ == "__main__":
    unittest.main()
