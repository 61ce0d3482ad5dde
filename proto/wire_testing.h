// Test helpers for hand-framed messages: a grpc::ByteBuffer flattened to a
// string, and a string cut into a buffer of small slices, so that a parser
// sees fields, varints and values straddle slice boundaries.

#ifndef BNPS_PROTO_WIRE_TESTING_H_
#define BNPS_PROTO_WIRE_TESTING_H_

#include <algorithm>
#include <string>
#include <vector>

#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"

namespace bnps::proto {

// All of `buffer`'s bytes, in one string.
inline std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// `bytes` as a buffer of slices of at most `piece` bytes.
inline grpc::ByteBuffer Split(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += piece) {
    slices.emplace_back(bytes.data() + at, std::min(piece, bytes.size() - at));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace bnps::proto

#endif  // BNPS_PROTO_WIRE_TESTING_H_
