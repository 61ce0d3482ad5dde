// Writes the seed corpus of the fuzz targets: well-formed messages of each
// kind they parse, so that fuzzing starts from inputs that reach deep into
// the parsers. Run once; its output is checked in under fuzz/corpus/:
//   bazel run //fuzz:make_seeds -- $PWD/fuzz/corpus

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "grpcpp/support/byte_buffer.h"
#include "proto/bnps.pb.h"
#include "proto/codec.h"
#include "proto/tensor_wire.h"

namespace {

std::string Flatten(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  b.Dump(&slices).IgnoreError();
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

void Write(const std::string& dir, const std::string& name,
           const std::string& bytes) {
  std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
}

// Bulk messages of a few tensors, as bnps's own builder frames them.
std::vector<std::string> Bulk(const google::protobuf::MessageLite& head,
                              int chunks_field, int64_t max_bytes) {
  std::vector<std::string> out;
  bnps::proto::ChunkedMessageBuilder builder(head, chunks_field, max_bytes);
  auto flush = [&out](grpc::ByteBuffer m) {
    out.push_back(Flatten(m));
    return true;
  };
  builder.AddTensor("conv.w", {2, 3}, {1, 2, 3, 4, 5, 6}, nullptr, flush);
  builder.AddTensor("bn.gamma", {4}, {1, 1, 1, 1}, nullptr, flush);
  builder.AddTensor("empty", {0}, {}, nullptr, flush);
  out.push_back(Flatten(builder.Build()));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR\n");
    return 2;
  }
  const std::string root = argv[1];
  namespace p = bnps::proto;

  // tensor_wire: a push and a pull, whole and cut into small messages.
  p::PushGradientsRequest push;
  push.set_job("bnps");
  push.set_worker(1);
  push.set_step(7);
  push.set_num_samples(32);
  // Each seed is one whole message (split point 0xffff: past its end) or
  // two split exactly between them (tensor_wire_fuzzer.cc).
  const auto one = [](const std::string& m) { return "\xff\xff" + m; };
  const auto two = [](const std::string& a, const std::string& b) {
    const size_t n = a.size();  // < 64 KiB
    return std::string(1, static_cast<char>(n & 0xff)) +
           static_cast<char>(n >> 8) + a + b;
  };
  const std::vector<std::string> whole =
      Bulk(push, p::PushGradientsRequest::kChunksFieldNumber, 1 << 20);
  const std::vector<std::string> small =
      Bulk(push, p::PushGradientsRequest::kChunksFieldNumber, 64);
  for (size_t i = 0; i < whole.size(); ++i) {
    Write(root + "/tensor_wire", "push" + std::to_string(i), one(whole[i]));
  }
  for (size_t i = 0; i + 1 < small.size(); ++i) {
    // Consecutive messages: a tensor's chunks may span them.
    Write(root + "/tensor_wire", "push_pair" + std::to_string(i),
          two(small[i], small[i + 1]));
  }
  p::PullParametersResponse pull;
  pull.set_version(3);
  const std::vector<std::string> pulled =
      Bulk(pull, p::PullParametersResponse::kChunksFieldNumber, 1 << 20);
  for (size_t i = 0; i < pulled.size(); ++i) {
    Write(root + "/tensor_wire", "pull" + std::to_string(i), one(pulled[i]));
  }
  // A chunk whose key is not UTF-8: protobuf refuses it, so must the reader
  // (the fuzzer's first find).
  const std::string chunk = "\x0a\x04\xff\xfe\x1b\n";
  Write(root + "/tensor_wire", "non_utf8_key",
        one("\x2a" + std::string(1, static_cast<char>(chunk.size())) + chunk));

  // codec: BN requests and answers of every kind, and an init request.
  const bnps::bn::Moments moments{6, {0.5, -1.0, 2.0}, {1.0, 0.0, 3.5}};
  const bnps::bn::BackwardSums sums{{0.1, 0.2, -0.3}, {1.0, -2.0, 0.5}};
  const bnps::bn::RunningStats running{{0.0, 1.0, 2.0}, {1.0, 0.5, 0.25}};
  p::BnRequest fwd;
  fwd.set_id(2);
  fwd.set_job("bnps");
  fwd.set_worker(0);
  fwd.set_step(4);
  fwd.set_layer("block1.bn");
  fwd.set_phase(p::BN_FORWARD);
  p::EncodeMoments(moments, fwd.mutable_moments());
  Write(root + "/codec", "bn_forward", fwd.SerializeAsString());
  p::BnRequest bwd = fwd;
  bwd.clear_moments();
  bwd.set_phase(p::BN_BACKWARD);
  p::EncodeSums(sums, bwd.mutable_sums());
  Write(root + "/codec", "bn_backward", bwd.SerializeAsString());
  p::BnRequest local = fwd;
  local.clear_moments();
  local.set_phase(p::BN_LOCAL_RUNNING);
  p::EncodeRunning(running, local.mutable_running());
  Write(root + "/codec", "bn_local_running", local.SerializeAsString());
  p::BnResponse answer;
  answer.set_id(2);  // decoded with 3 channels
  answer.set_contributors(2);
  p::EncodeMoments(moments, answer.mutable_moments());
  p::EncodeSums(sums, answer.mutable_sums());
  p::EncodeRunning(running, answer.mutable_running());
  Write(root + "/codec", "bn_answer", answer.SerializeAsString());
  p::InitParametersRequest init;
  init.set_job("bnps");
  p::NamedTensor* t = init.add_parameters();
  t->set_key("conv.w");
  p::EncodeFloat32({1, 2, 3, 4, 5, 6}, {2, 3}, t->mutable_value());
  Write(root + "/codec", "init", init.SerializeAsString());

  // Tokens (for token_fuzzer and files_fuzzer) and a PEM-looking file.
  for (const char* dir : {"/token", "/files"}) {
    Write(root + dir, "token", "0123456789abcdef0123456789abcdef\n");
    Write(root + dir, "short_token", "abc");
  }
  Write(root + "/files", "pem",
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
  std::printf("seeds written under %s\n", root.c_str());
  return 0;
}
