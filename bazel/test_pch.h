// The system headers most C++ tests parse: the standard library, GoogleTest,
// Abseil, Protocol Buffers and gRPC (bnps's own headers stay out, so bazel/
// depends on nothing of the tree).
// Precompiled once (bazel/pch.bzl) and force-included into each test source.
// Tests still include what they use; this only saves parsing it again.
#ifndef BNPS_BAZEL_TEST_PCH_H_
#define BNPS_BAZEL_TEST_PCH_H_

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
#include "gmock/gmock.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

#endif  // BNPS_BAZEL_TEST_PCH_H_
