#include "server/shard_state_codec.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace bnps::server {
namespace {

constexpr char kStateMagic[8] = {'B', 'N', 'P', 'S', 'S', 'T', '0', '2'};

std::string LengthOf(size_t n) {
  std::string le(8, '\0');
  for (int i = 0; i < 8; ++i) le[i] = static_cast<char>(uint64_t{n} >> (8 * i));
  return le;
}

// Reads the next record of `*in` into `*out`; false if `*in` is short.
bool NextRecord(absl::string_view* in, absl::string_view* out) {
  if (in->size() < 8) return false;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) {
    n |= uint64_t{static_cast<unsigned char>((*in)[i])} << (8 * i);
  }
  in->remove_prefix(8);
  if (n > in->size()) return false;
  *out = in->substr(0, n);
  in->remove_prefix(n);
  return true;
}

}  // namespace

absl::Status EncodeShardState(const proto::ShardCheckpoint& head,
                              const std::vector<absl::string_view>& tensors,
                              size_t max_message_bytes, StatePieces* out) {
  if (tensors.size() != 2 * static_cast<size_t>(head.params_size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        tensors.size(), " tensors for ", head.params_size(),
        " parameters: each needs its values and its momentum"));
  }
  // Checked, not assumed: protobuf gives "" past its limit.
  const size_t head_bytes = head.ByteSizeLong();
  std::string message;
  if (head_bytes > max_message_bytes || !head.SerializeToString(&message)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the shard's state without its tensors takes ", head_bytes,
        " bytes, more than a checkpoint's message may hold (",
        max_message_bytes, "): spread the keys over more shards"));
  }
  out->owned.clear();
  out->owned.reserve(2 + tensors.size());  // no reallocation: views stay
  out->owned.push_back(LengthOf(message.size()));
  out->owned.push_back(std::move(message));
  out->pieces = {absl::string_view(kStateMagic, sizeof(kStateMagic)),
                 out->owned[0], out->owned[1]};
  for (absl::string_view t : tensors) {
    out->owned.push_back(LengthOf(t.size()));
    out->pieces.push_back(out->owned.back());
    out->pieces.push_back(t);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> EncodeShardState(
    const proto::ShardCheckpoint& checkpoint, size_t max_message_bytes) {
  proto::ShardCheckpoint head = checkpoint;
  std::vector<absl::string_view> tensors;
  for (proto::ParamState& p : *head.mutable_params()) {
    p.clear_values();
    p.clear_momentum();
  }
  for (const proto::ParamState& p : checkpoint.params()) {
    tensors.push_back(p.values());
    tensors.push_back(p.momentum());
  }
  StatePieces pieces;
  if (absl::Status s = EncodeShardState(head, tensors, max_message_bytes, &pieces);
      !s.ok()) {
    return s;
  }
  std::string payload;
  for (absl::string_view p : pieces.pieces) payload.append(p.data(), p.size());
  return payload;
}

absl::StatusOr<proto::ShardCheckpoint> DecodeShardState(
    const std::string& payload, const std::string& from) {
  proto::ShardCheckpoint c;
  absl::string_view in = payload;
  if (!absl::ConsumePrefix(&in, absl::string_view(kStateMagic, sizeof(kStateMagic)))) {
    // A server of before the record format wrote one message.
    if (!c.ParseFromString(payload)) {
      return absl::DataLossError(absl::StrCat(from, ": not a shard checkpoint"));
    }
    return c;
  }
  absl::string_view head;
  if (!NextRecord(&in, &head) ||
      head.size() > static_cast<size_t>(INT32_MAX) ||
      !c.ParseFromArray(head.data(), static_cast<int>(head.size()))) {
    return absl::DataLossError(absl::StrCat(from, ": not a shard checkpoint"));
  }
  for (proto::ParamState& p : *c.mutable_params()) {
    absl::string_view values, momentum;
    if (!NextRecord(&in, &values) || !NextRecord(&in, &momentum)) {
      return absl::DataLossError(absl::StrCat(
          from, ": the tensors of parameter '", p.key(), "' are missing"));
    }
    p.set_values(std::string(values));
    p.set_momentum(std::string(momentum));
  }
  if (!in.empty()) {
    return absl::DataLossError(
        absl::StrCat(from, ": ", in.size(), " bytes after the last tensor"));
  }
  return c;
}

}  // namespace bnps::server
