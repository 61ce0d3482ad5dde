"""cuda_library: compiles .cu files with the installed nvcc into a cc_library.

nvcc runs from a genrule (sm_90 machine code plus compute_90 PTX, so newer GPUs
JIT the PTX); the objects become a cc_library linked against the CUDA runtime.
Keep .cu files free of Abseil and gRPC headers: expose plain launchers that
return cudaError_t and wrap them in a .cc file compiled by the host compiler.
"""

NVCC = "/usr/local/cuda/bin/nvcc"

NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-Wall",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
    "--expt-relaxed-constexpr",
]

def cuda_library(name, srcs, hdrs = [], deps = [], visibility = None, **kwargs):
    """A cc_library whose .cu sources are compiled by nvcc.

    Args:
      name: target name.
      srcs: .cu files.
      hdrs: headers the .cu files and their users include (repository-root paths).
      deps: cc_library targets the objects need at link time.
      visibility: as for cc_library.
      **kwargs: passed to the cc_library.
    """
    objs = []
    for src in srcs:
        if not src.endswith(".cu"):
            fail("cuda_library srcs must be .cu files: " + src)
        obj = name + "_objs/" + src[:-len(".cu")] + ".pic.o"
        native.genrule(
            name = name + "_nvcc_" + src.replace("/", "_").replace(".", "_"),
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = " ".join([NVCC] + NVCC_FLAGS + [
                "-I.",
                "-I$(GENDIR)",
                "-c $(location " + src + ")",
                "-o $@",
            ]),
            message = "nvcc " + src,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        visibility = visibility,
        **kwargs
    )
