// Fuzzes what the raw-TCP BN listener reads from the network
// (server/bn_socket_server.h): arbitrary bytes cut into frames
// (proto/bn_frame.h), fed in pieces of a size taken from the input, the
// first frame parsed as a BnHello and taken through the server's side of
// the handshake (security/bn_handshake.h), the second as the client's proof
// and as a server's reply to a client, and the rest as BnRequests whose
// statistics (a batch's entries' too) go through the codec's decoders. No
// made-up proof may ever hold, on either side. A frame's payload must lie
// inside the bytes given, and every frame re-framed must read back the
// same.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "proto/bn_frame.h"
#include "proto/bnps.pb.h"
#include "proto/codec.h"
#include "security/bn_handshake.h"
#include "security/worker_token.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 64;
  const char* bytes = reinterpret_cast<const char*>(data + 1);
  const size_t n = size - 1;
  // A job with a token and per-worker tokens; the fuzzer knows neither.
  static const bnps::security::TokenAuthenticator auth(
      "fuzz-job-token-0123456789", /*per_worker=*/true, /*num_workers=*/4);
  bnps::security::HelloServer server(&auth, "tcp");
  bnps::proto::FrameReader reader;
  size_t fed = 0, taken = 0;
  int frames = 0;
  while (fed < n) {
    const size_t k = std::min(piece, n - fed);
    reader.Append(bytes + fed, k);
    fed += k;
    for (;;) {
      absl::StatusOr<std::optional<absl::string_view>> f = reader.Next();
      if (!f.ok()) return 0;  // not ours: the connection would close
      if (!f->has_value()) break;
      const absl::string_view payload = **f;
      taken += bnps::proto::kFrameHeaderBytes + payload.size();
      if (taken > fed) std::abort();  // a frame past the bytes given
      ++frames;
      if (frames == 1) {
        bnps::proto::BnHello h;
        if (h.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
          absl::StatusOr<bnps::proto::BnHelloReply> first = server.Begin(h);
          // A hello that carries a token is never taken.
          if (first.ok() && !h.token().empty()) std::abort();
          if (first.ok() && !first->challenge()) std::abort();  // a token job
        }
        continue;
      }
      if (frames == 2) {
        bnps::proto::BnHelloProof proof;
        if (proof.ParseFromArray(payload.data(), static_cast<int>(payload.size())) &&
            server.awaiting_proof() && server.Finish(proof).ok()) {
          std::abort();  // a proof made without the key held
        }
        bnps::proto::BnHelloReply reply;
        if (reply.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
          bnps::proto::BnHello mine;
          mine.set_job("bnps");
          const bnps::security::HelloClient client(
              mine, "fuzz-job-token-0123456789", "tcp", "fuzz");
          absl::StatusOr<std::optional<bnps::proto::BnHelloProof>> answer =
              client.OnFirstReply(reply);
          // The client's nonce is fresh: no reply made before it can prove.
          if (answer.ok() && answer->has_value()) std::abort();
        }
        continue;
      }
      bnps::proto::BnRequest r;
      if (!r.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
        continue;
      }
      (void)bnps::proto::DecodeMoments(r.moments());
      (void)bnps::proto::DecodeSums(r.sums());
      (void)bnps::proto::DecodeRunning(r.running());
      for (const bnps::proto::BnRequest& e : r.batch()) {  // a host's batch
        (void)bnps::proto::DecodeMoments(e.moments());
        (void)bnps::proto::DecodeSums(e.sums());
        (void)bnps::proto::DecodeRunning(e.running());
      }
      std::string again;
      if (bnps::proto::AppendFrame(r, &again).ok()) {
        bnps::proto::FrameReader back;
        back.Append(again.data(), again.size());
        absl::StatusOr<std::optional<absl::string_view>> g = back.Next();
        if (!g.ok() || !g->has_value()) std::abort();
        bnps::proto::BnRequest r2;
        if (!r2.ParseFromArray((*g)->data(), static_cast<int>((*g)->size())) ||
            r2.SerializeAsString() != r.SerializeAsString()) {
          std::abort();
        }
      }
    }
  }
  if (reader.buffered() != fed - taken) std::abort();
  return 0;
}
