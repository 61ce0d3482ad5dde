#include "server/read_state.h"

#include <algorithm>
#include <utility>

#include "proto/codec.h"

namespace bnps::server {

std::vector<proto::ReadStateResponse> ReadStateMessages(const Shard& shard,
                                                        int64_t message_bytes) {
  message_bytes = std::max<int64_t>(message_bytes, 64);
  // One copy of each, taken at once: parameters of one version set, and the
  // running statistics as they are.
  const store::StoreState store = shard.store().Export();
  const BnState bn = shard.bn().Export();
  std::vector<proto::ReadStateResponse> out(1);
  int64_t step = store.keys.empty() ? 0 : INT64_MAX;
  for (const store::StoreState::Key& k : store.keys) step = std::min(step, k.version);
  out[0].set_step(step);
  out[0].set_job_complete(shard.job_complete());
  int64_t used = 0;  // payload bytes in out.back()
  // Room for `bytes` more in the last message, or a new one.
  auto room = [&](int64_t bytes) {
    if (used > 0 && used + bytes > message_bytes) {
      out.emplace_back();
      used = 0;
    }
    used += bytes;
  };
  const int64_t floats = message_bytes / 4;
  for (const store::StoreState::Key& k : store.keys) {
    const std::vector<float>& v = *k.values;
    const int64_t n = static_cast<int64_t>(v.size());
    int64_t offset = 0;
    do {  // a tensor of 0 elements still travels, as one empty chunk
      const int64_t part = std::min(floats, n - offset);
      room(part * 4 + static_cast<int64_t>(k.key.size()) + 32);
      proto::TensorChunk* c = out.back().add_chunks();
      c->set_key(k.key);
      for (int64_t d : k.shape) c->add_shape(d);
      c->set_offset(offset);
      const int64_t part_shape[] = {part};
      proto::EncodeFloat32(absl::MakeConstSpan(v.data() + offset, part),
                           part_shape, c->mutable_part());
      offset += part;
    } while (offset < n);
  }
  const int64_t channels_per = std::max<int64_t>(message_bytes / 16, 1);
  for (const BnState::Layer& l : bn.layers) {
    if (!l.running.has_value()) continue;
    const int64_t n = static_cast<int64_t>(l.running->mean.size());
    int64_t offset = 0;
    do {
      const int64_t part = std::min(channels_per, n - offset);
      room(part * 16 + static_cast<int64_t>(l.name.size()) + 32);
      proto::BnRunningChunk* c = out.back().add_bn();
      c->set_layer(l.name);
      c->set_channels(n);
      c->set_offset(offset);
      proto::EncodeFloat64(
          absl::MakeConstSpan(l.running->mean.data() + offset, part),
          c->mutable_part()->mutable_mean());
      proto::EncodeFloat64(
          absl::MakeConstSpan(l.running->var.data() + offset, part),
          c->mutable_part()->mutable_var());
      offset += part;
    } while (offset < n);
  }
  return out;
}

int64_t ReadStateBytes(const Shard& shard) {
  const store::ParameterStore::Stats stats = shard.store().GetStats();
  // Per key and per BN layer: its name, shape and chunk framing (names
  // are short); a BN layer's statistics take 16 bytes a channel (mean and
  // var, float64).
  constexpr int64_t kPerKey = 256;
  int64_t bn = 0;
  for (const BnState::Layer& l : shard.bn().Export().layers) {
    if (l.running.has_value()) {
      bn += kPerKey + 16 * static_cast<int64_t>(l.running->mean.size());
    }
  }
  return 4 * stats.num_values + kPerKey * stats.num_keys + bn;
}

}  // namespace bnps::server
