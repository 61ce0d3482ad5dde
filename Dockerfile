# The bnps image: bnps_server, bnps_worker and bnps_status on Debian 12, CPU
# only (Dockerfile.cuda is the GPU variant). docs/deploy.md says how to run it.
#
#   podman build --network host -t bnps:latest .     (or docker build)
#   podman build --build-arg WITH_DATASET=0 ...      without Fashion-MNIST
#
# Build stage: tools/setup.sh installs the build dependencies from Debian's
# packages, then Bazel builds the three binaries without the CUDA toolkit
# (--config=cpu). Bazel's disk cache is a cache mount, so a rebuild after a
# source change compiles only what changed.
# Runtime stage: the runtime libraries of those -dev packages, the binaries,
# an unprivileged user (uid 10001), and Fashion-MNIST unless WITH_DATASET=0.

ARG BUILD_BASE=debian:bookworm
ARG RUNTIME_BASE=debian:bookworm-slim

FROM ${BUILD_BASE} AS build
# setup.sh alone first: its layer (the packages) is reused until it changes.
COPY tools/setup.sh /src/tools/setup.sh
RUN /src/tools/setup.sh --debian-only && rm -rf /var/lib/apt/lists/*
COPY . /src
WORKDIR /src
RUN --mount=type=cache,target=/root/.cache/bazel-disk,id=bnps-bazel-disk \
    bazel build --config=cpu --disk_cache=/root/.cache/bazel-disk \
        //:bnps_server //:bnps_worker //:bnps_status \
    && mkdir -p /out \
    && cp bazel-bin/server/bnps_server bazel-bin/worker/bnps_worker \
          bazel-bin/tools/bnps_status /out/ \
    && bazel shutdown

FROM ${RUNTIME_BASE}
ARG WITH_DATASET=1
# The runtime halves of the -dev packages setup.sh installs (found with ldd on
# the binaries and dpkg -S on the libraries): gRPC, Protocol Buffers, Abseil,
# oneDNN (which pulls the OpenCL loader), OpenMP, libatomic, zlib, and
# cpp-httplib (the /metrics endpoint).
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 libdnnl2 \
        libgomp1 libatomic1 zlib1g libc-ares2 libre2-9 libssl3 libcpp-httplib0.11 \
        $([ "$WITH_DATASET" = 1 ] && echo dataset-fashion-mnist) \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
# Fails the build if a library is missing, rather than the first run.
RUN ! ldd /usr/local/bin/bnps_server /usr/local/bin/bnps_worker \
        /usr/local/bin/bnps_status | grep 'not found'
# Checkpoints go to /var/lib/bnps/checkpoints (a volume in compose and
# Kubernetes; a new volume takes this directory's owner).
RUN groupadd --system --gid 10001 bnps \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/bnps \
        --create-home --shell /usr/sbin/nologin bnps \
    && install -d -o 10001 -g 10001 /var/lib/bnps/checkpoints
USER 10001
WORKDIR /var/lib/bnps
# Flags and BNPS_* variables configure each process (bnps_server --help); a
# server in a container needs --host=0.0.0.0 (BNPS_HOST). No BNPS_ variable is
# set here: one bnps_worker does not know would stop it.
EXPOSE 7000
CMD ["bnps_server", "--help"]
