"""bnps_fuzzer: one fuzz target, built two ways."""

def bnps_fuzzer(name, srcs, deps, corpus):
    """A libFuzzer target and a test that replays its corpus.

    `name`: a libFuzzer binary, built only under --config=fuzz (clang;
    tools/fuzz.sh builds and runs it). `name + "_replay_test"`: a test in
    the ordinary suite that runs every input of `corpus` (a folder under
    fuzz/) through the target, with or without --config=asan.
    """
    native.cc_binary(
        name = name,
        srcs = srcs,
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual"],
        deps = deps,
    )
    native.cc_test(
        name = name + "_replay_test",
        size = "small",
        srcs = srcs + ["replay_main.cc"],
        args = ["fuzz/" + corpus],
        data = native.glob([corpus + "/**"]),
        deps = deps,
    )
