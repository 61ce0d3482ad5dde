"""Precompiled headers, and the cc rules of the tree that use them.

Much of a source file's compile time is spent parsing the same system
headers (the standard library, Abseil, Protocol Buffers, gRPC; GoogleTest in
tests): about a second of the typical four to six. `cc_pch` compiles one
header of those once, with the command line Bazel gives the sources that use
it (the toolchain's flags, --copt and --cxxopt, and for tests the -O0 that
bnps_cc_test adds), and bnps_cc_library, bnps_cc_binary and bnps_cc_test
force-include it; the compiler then loads the precompiled header beside it
instead of parsing the headers again. gcc ignores one that does not match a
source's flags (the header is parsed as usual: a mismatch costs time, never
correctness); clang refuses it with an error. So rules whose copts go beyond
warnings (-O3, -fopenmp) do without, and so do, in the sanitizer build
(//bazel:sanitizers, clang), the packages the fuzz targets reach, which
compile there with flags of their own (FUZZED_PACKAGES). The sources still
include what they use.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

_CPP_COMPILE = "c++-compile"

def _cc_pch_impl(ctx):
    # The header is copied under a name of its own in the output tree;
    # `-include` names that copy by its path there, and the compiler loads the
    # .gch beside it (clang looks only there, not along the include path).
    header = ctx.actions.declare_file(ctx.label.name + "/pch.h")
    ctx.actions.expand_template(template = ctx.file.hdr, output = header, substitutions = {})
    gch = ctx.actions.declare_file(ctx.label.name + "/pch.h.gch")

    cc_toolchain = find_cpp_toolchain(ctx)
    features = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    variables = cc_common.create_compile_variables(
        feature_configuration = features,
        cc_toolchain = cc_toolchain,
        user_compile_flags = ctx.fragments.cpp.copts + ctx.fragments.cpp.cxxopts +
                             ctx.attr.copts + ["-x", "c++-header"],
        source_file = header.path,
        output_file = gch.path,
        quote_include_directories = depset([".", ctx.bin_dir.path, ctx.genfiles_dir.path]),
        use_pic = True,
    )
    ctx.actions.run(
        executable = cc_common.get_tool_for_action(
            feature_configuration = features,
            action_name = _CPP_COMPILE,
        ),
        arguments = cc_common.get_memory_inefficient_command_line(
            feature_configuration = features,
            action_name = _CPP_COMPILE,
            variables = variables,
        ),
        env = cc_common.get_environment_variables(
            feature_configuration = features,
            action_name = _CPP_COMPILE,
            variables = variables,
        ),
        inputs = depset([header] + ctx.files.srcs, transitive = [cc_toolchain.all_files]),
        outputs = [gch],
        # clang writes the header's absolute path (in this workspace's output
        # tree) into the .gch, and the dependency files of the sources that
        # load it list that path; another workspace's Bazel refuses it as an
        # undeclared inclusion. So clang's .gch is never taken from a disk or
        # remote cache (then neither are the compiles that read it: their
        # inputs differ); gcc's holds no such path.
        execution_requirements = {"no-remote-cache": "1"} if cc_toolchain.compiler == "clang" else {},
        mnemonic = "CppPch",
        progress_message = "Precompiling %s" % ctx.file.hdr.short_path,
    )
    return [CcInfo(compilation_context = cc_common.create_compilation_context(
        headers = depset([header, gch] + ctx.files.srcs),
    ))]

cc_pch = rule(
    implementation = _cc_pch_impl,
    doc = "A header of system headers (and `srcs`) precompiled with the build's " +
          "compile flags and `copts`, as a cc dependency.",
    attrs = {
        "hdr": attr.label(allow_single_file = [".h"], mandatory = True),
        # Headers of the tree that `hdr` includes.
        "srcs": attr.label_list(allow_files = [".h"]),
        # After --copt and --cxxopt, as a source's own copts come.
        "copts": attr.string_list(),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    incompatible_use_toolchain_transition = True,
)

# The packages whose code the fuzz targets run. In the sanitizer build they
# compile optimized and with libFuzzer's coverage instrumentation, so that a
# fuzz run tries as many inputs as it can in its time, while everything else
# compiles unoptimized there (a quarter to a third faster). .bazelrc gives
# the same flags to the code generated from proto/, which no rule here
# compiles.
FUZZED_PACKAGES = ["bn", "fuzz", "proto", "security"]

_FUZZED_COPTS = ["-O1", "-fsanitize=fuzzer-no-link"]

def _uses(pch, copts, deps):
    """copts and deps of a rule whose sources start from `pch` (a cc_pch of
    bazel/BUILD): all but those with copts beyond warnings (-O3, -fopenmp),
    which the header was not compiled with, and in the sanitizer build those
    of FUZZED_PACKAGES, which get their flags instead."""
    fuzzed = native.package_name().split("/")[0] in FUZZED_PACKAGES
    sanitized = _FUZZED_COPTS if fuzzed else []
    if [c for c in copts if not c.startswith("-W")]:
        return copts + select({
            "//bazel:sanitizers": sanitized,
            "//conditions:default": [],
        }), deps
    include = ["-include", "$(BINDIR)/bazel/%s/pch.h" % pch]
    return copts + select({
        "//bazel:sanitizers": sanitized if fuzzed else include,
        "//conditions:default": include,
    }), deps + ["//bazel:" + pch]

def bnps_cc_library(name, copts = [], deps = [], **kwargs):
    """cc_library whose sources start from the precompiled system headers."""
    copts, deps = _uses("lib_pch", copts, deps)
    native.cc_library(name = name, copts = copts, deps = deps, **kwargs)

def bnps_cc_binary(name, copts = [], deps = [], **kwargs):
    """cc_binary whose sources start from the precompiled system headers."""
    copts, deps = _uses("lib_pch", copts, deps)
    native.cc_binary(name = name, copts = copts, deps = deps, **kwargs)

# What every source of a test compiles with beyond the build's flags (and so
# the tests' precompiled header, //bazel:test_pch).
TEST_COPTS = ["-O0"]

def bnps_cc_test(name, copts = [], deps = [], **kwargs):
    """cc_test whose sources compile at -O0 and start from the tests'
    precompiled headers (the system headers and GoogleTest, at -O0 too).

    The code under test stays optimized in its own libraries; optimizing the
    tests' own bodies cost up to 4x their compile time
    (store/parameter_store_test.cc: 52 s at -O2, 11 s at -O0)."""
    copts, deps = _uses("test_pch", copts, deps)
    native.cc_test(name = name, copts = copts + TEST_COPTS, deps = deps, **kwargs)
