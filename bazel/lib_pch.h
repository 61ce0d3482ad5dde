// The system headers most of the tree's C++ sources parse: the standard
// library, Abseil, Protocol Buffers and gRPC. Precompiled once (bazel/pch.bzl:
// lib_pch) and force-included into each source of the libraries and
// binaries; the sources still include what they use.
#ifndef BNPS_BAZEL_LIB_PCH_H_
#define BNPS_BAZEL_LIB_PCH_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"

#endif  // BNPS_BAZEL_LIB_PCH_H_
