"""bnps.policy: policy::ResolvePolicy through libbnps.so's
bnps_resolve_policy (the pairs, the binaries' own error messages), and
bnps.cluster's lists of choices against the C++ ones. Needs libbnps.so,
neither NumPy nor torch."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles

from bnps import cluster, errors, policy  # noqa: E402


class ResolveTest(unittest.TestCase):
    def test_nothing_given_is_sync(self):
        p = policy.resolve()
        self.assertEqual((p.bn_policy, p.gradients, p.name, p.flags),
                         ("sync", "sync", "sync", ["--policy=sync"]))

    def test_shorthands_and_other_pairs(self):
        cases = [(("async", None, None),
                  ("async", "async", "async", ["--policy=async"])),
                 ((None, "recal", None),
                  ("recal", "sync", "recal", ["--policy=recal"])),
                 (("", "async", "sync"),
                  ("async", "sync", "bn_policy=async,gradients=sync",
                   ["--bn_policy=async", "--gradients=sync"])),
                 ((None, None, "async"),
                  ("sync", "async", "bn_policy=sync,gradients=async",
                   ["--bn_policy=sync", "--gradients=async"]))]
        for given, want in cases:
            with self.subTest(given=given):
                p = policy.resolve(*given)
                self.assertEqual((p.bn_policy, p.gradients, p.name, p.flags),
                                 want)

    def test_unknown_names_and_contradictions_are_invalid_argument(self):
        with self.assertRaises(errors.InvalidArgument) as e:
            policy.resolve("recal", None, "async")
        self.assertEqual(e.exception.message,
                         "--policy=recal means --gradients=sync, not async; "
                         "give --bn_policy and --gradients alone")
        with self.assertRaises(ValueError) as e:  # InvalidArgument is one
            policy.resolve(bn_policy="fast")
        self.assertIn("unknown policy 'fast'; expected sync, async, recal or "
                      "local", str(e.exception))

    def test_the_pure_lists_are_the_cpp_ones(self):
        p = policy.resolve()
        self.assertEqual(p.policies, list(cluster.POLICIES))
        self.assertEqual(p.gradient_modes, list(cluster.GRADIENT_MODES))

    def test_no_library_is_an_import_error_that_says_how(self):
        import bnps
        package = os.path.dirname(os.path.abspath(bnps.__file__))
        # Where this process found libbnps.so: the Bazel runfiles' python/,
        # or the installed wheel's package.
        lib_dir = next(d for d in (os.path.join(os.getcwd(), "python"), package)
                       if os.path.isfile(os.path.join(d, "libbnps.so")))
        with tempfile.TemporaryDirectory() as tmp:
            # The package's Python alone: no library beside it.
            shutil.copytree(package, os.path.join(tmp, "bnps"),
                            ignore=shutil.ignore_patterns(
                                "*.so*", "bin", "__pycache__"))
            env = {k: v for k, v in os.environ.items()
                   if k not in ("BNPS_NATIVE_LIB", "PYTHONPATH")}
            r = subprocess.run(
                [sys.executable, "-c",
                 "from bnps import policy; policy.resolve('sync')"],
                cwd=tmp, env=env, capture_output=True, text=True, timeout=60)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("ImportError: bnps: no libbnps.so", r.stderr)
            self.assertIn("bazel build //python:libbnps.so", r.stderr)
            # A directory named first is where it is found.
            r = subprocess.run(
                [sys.executable, "-c",
                 "import sys; from bnps import policy; "
                 "print(policy.resolve('async', library_dirs=[sys.argv[1]]).name)",
                 lib_dir],
                cwd=tmp, env=env, capture_output=True, text=True, timeout=60)
            self.assertEqual((r.returncode, r.stdout), (0, "async\n"), r.stderr)


if __name__ == "__main__":
    unittest.main()
