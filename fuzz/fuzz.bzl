"""bnps_fuzzer: one fuzz target, built two ways."""

load("//bazel:pch.bzl", "bnps_cc_binary", "bnps_cc_test")

# How long each target fuzzes in the //:asan suite (the README's test
# command); tools/fuzz.sh fuzzes for as long as it is asked.
RUN_SECONDS = 15

def bnps_fuzzer(name, srcs, deps, corpus):
    """A libFuzzer target, a test that replays its corpus, and a short run.

    `name`: a libFuzzer binary, built only under --config=fuzz or
    --config=asan (clang; tools/fuzz.sh builds and runs it).
    `name + "_replay_test"`: a test in the ordinary suite that runs every
    input of `corpus` (a folder under fuzz/) through the target, with or
    without --config=asan. `name + "_run_test"`: RUN_SECONDS of libFuzzer
    from the corpus, in the //:asan suite only (manual: gcc cannot link a
    libFuzzer target), never cached (each run fuzzes anew).
    """
    bnps_cc_binary(
        name = name,
        srcs = srcs,
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual"],
        deps = deps,
    )
    bnps_cc_test(
        name = name + "_replay_test",
        size = "small",
        srcs = srcs,
        args = ["fuzz/" + corpus],
        data = native.glob([corpus + "/**"]),
        deps = deps + ["//fuzz:replay_main"],
    )
    native.sh_test(
        name = name + "_run_test",
        size = "small",
        srcs = ["fuzz_run_test.sh"],
        args = [
            "$(location :%s)" % name,
            "fuzz/" + corpus,
            str(RUN_SECONDS),
        ],
        data = [":" + name] + native.glob([corpus + "/**"]),
        # Skipped by `bazel test //...`, which gcc builds.
        target_compatible_with = select({
            "//bazel:sanitizers": [],
            "//conditions:default": ["//bazel:incompatible"],
        }),
        tags = [
            "external",
            "manual",
        ],
    )
