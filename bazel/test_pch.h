// What the C++ tests parse: the system headers of lib_pch.h and GoogleTest.
// Precompiled once (bazel/pch.bzl: test_pch, at the tests' -O0) and
// force-included into each test source; tests still include what they use.
#ifndef BNPS_BAZEL_TEST_PCH_H_
#define BNPS_BAZEL_TEST_PCH_H_

#include "bazel/lib_pch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#endif  // BNPS_BAZEL_TEST_PCH_H_
