#include "client/internal/bulk_transfer.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/sync_stream.h"
#include "proto/codec.h"
#include "proto/limits.h"
#include "proto/sharding.h"
#include "proto/tensor_wire.h"

namespace bnps::client::internal {
namespace {

// InitParameters packs tensors into messages of at most this many bytes.
constexpr size_t kInitMessageBytes = proto::kMaxMessageBytes - 4096;
// Upper bound of the bytes a NamedTensor adds beyond its float
// payload, key and shape (tags, lengths, dtype, offset).
constexpr size_t kTensorOverheadBytes = 64;

// Bytes of a tensor's encoding beyond its float payload: key, shape, tags.
size_t TensorOverhead(const std::string& key, const Param& p) {
  return key.size() + 11 * p.shape.size() + kTensorOverheadBytes;
}

absl::Status CheckParam(const std::string& key, const Param& p) {
  if (absl::Status s = CheckKey(key, "key"); !s.ok()) return s;
  absl::StatusOr<int64_t> n = proto::NumElements(p.shape);
  if (!n.ok()) return Annotate(n.status(), absl::StrCat("key '", key, "'"));
  if (*n != static_cast<int64_t>(p.values.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("key '", key, "': shape has ", *n, " elements but ",
                     p.values.size(), " values are given"));
  }
  return absl::OkStatus();
}

// The shards that have keys to send, in order.
template <typename Key>
std::vector<int> ShardsWithKeys(const std::vector<std::vector<Key>>& by_shard) {
  std::vector<int> shards;
  for (int i = 0; i < static_cast<int>(by_shard.size()); ++i) {
    if (!by_shard[i].empty()) shards.push_back(i);
  }
  return shards;
}

// Reads a PullParameters stream to its end into `tensors` and says how it
// ended: bytes that are not a pull's (the call is then cancelled and
// drained) as INVALID_ARGUMENT naming `from`; else the call's status; else
// a tensor cut off at the end of the stream; else OK.
absl::Status ReadPullStream(grpc::ClientReader<grpc::ByteBuffer>& reader,
                            grpc::ClientContext& context,
                            proto::TensorReader& tensors,
                            const std::string& from) {
  grpc::ByteBuffer message;
  proto::PullParametersResponse head;
  absl::Status bad;
  while (bad.ok() && reader.Read(&message)) {
    bad = tensors.Read(message,
                       proto::PullParametersResponse::kChunksFieldNumber,
                       &head);
  }
  if (!bad.ok()) {
    context.TryCancel();
    while (reader.Read(&message)) {
    }
    reader.Finish();
    return Malformed(from, bad);
  }
  if (absl::Status s = proto::FromGrpcStatus(reader.Finish()); !s.ok()) {
    return s;
  }
  if (tensors.pending()) {
    return Malformed(from, absl::InvalidArgumentError(
                               "the stream ended in the middle of a tensor"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PullShardStream(
    Channels& channels, int shard, const proto::PullParametersRequest& request,
    grpc::ClientContext& context,
    absl::FunctionRef<Param*(const std::string& key)> place,
    absl::FunctionRef<void(const std::string& key)> arrived) {
  grpc::ByteBuffer request_bytes;
  bool own;
  if (grpc::Status st =
          grpc::SerializationTraits<proto::PullParametersRequest>::Serialize(
              request, &request_bytes, &own);
      !st.ok()) {
    return proto::FromGrpcStatus(st);
  }
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
          channels.shard(shard).channel.get(),
          *channels.shard(shard).pull_method, &context, request_bytes));

  const std::set<std::string> asked(request.keys().begin(),
                                    request.keys().end());
  std::set<std::string> received;
  proto::TensorReader tensors(
      [&](const std::string& key, absl::Span<const int64_t> shape,
          int64_t n) -> absl::StatusOr<float*> {
        const int owner = proto::ShardForKey(key, channels.num_shards());
        if (owner != shard) {
          return absl::InvalidArgumentError(
              absl::StrCat("key '", key, "' belongs to shard ", owner));
        }
        Param* p = asked.empty() || asked.count(key) > 0 ? place(key) : nullptr;
        if (p == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("key '", key, "' was not requested"));
        }
        if (!received.insert(key).second) {
          return absl::InvalidArgumentError(
              absl::StrCat("key '", key, "' was sent twice"));
        }
        p->shape.assign(shape.begin(), shape.end());
        p->values.resize(n);
        return p->values.data();
      },
      [&](const std::string& key) {
        arrived(key);
        return absl::OkStatus();
      });
  if (absl::Status s =
          ReadPullStream(*reader, context, tensors, channels.ShardName(shard));
      !s.ok()) {
    return s;
  }
  for (const std::string& key : asked) {
    if (received.count(key) == 0) {
      return absl::NotFoundError(absl::StrCat("key '", key, "' was not sent"));
    }
  }
  return absl::OkStatus();
}

absl::Status BulkTransfer::InitParameters(
    const Params& params) {
  std::vector<std::vector<const std::string*>> by_shard(channels_->num_shards());
  for (const auto& [key, p] : params) {
    if (absl::Status s = CheckParam(key, p); !s.ok()) return s;
    if (p.values.size() * sizeof(float) + TensorOverhead(key, p) >
        kInitMessageBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key '", key, "': ", p.values.size(),
          " floats do not fit one InitParameters message (at most ",
          proto::kMaxMessageBytes, " bytes)"));
    }
    by_shard[proto::ShardForKey(key, channels_->num_shards())].push_back(&key);
  }
  const std::vector<int> shards = ShardsWithKeys(by_shard);
  return RunParallel(static_cast<int>(shards.size()), [&](int j) {
    const int shard = shards[j];
    return Annotate(InitShard(shard, by_shard[shard], params),
                    absl::StrCat("InitParameters on ", channels_->ShardName(shard)));
  });
}

absl::Status BulkTransfer::InitShard(int shard,
                                 const std::vector<const std::string*>& keys,
                                 const Params& params) {
  proto::InitParametersRequest request;
  request.set_job(channels_->options().job);
  request.set_worker(channels_->options().worker);
  size_t bytes = 0;
  auto send = [&]() {
    return channels_->WithRetries(shard, [&](grpc::ClientContext& context) {
      proto::InitParametersResponse response;
      return proto::FromGrpcStatus(
          channels_->shard(shard).stub->InitParameters(&context, request, &response));
    });
  };
  for (const std::string* key : keys) {
    const Param& p = params.at(*key);
    const size_t size =
        p.values.size() * sizeof(float) + TensorOverhead(*key, p);
    if (request.parameters_size() > 0 && bytes + size > kInitMessageBytes) {
      if (absl::Status s = send(); !s.ok()) return s;
      request.clear_parameters();
      bytes = 0;
    }
    proto::NamedTensor* t = request.add_parameters();
    t->set_key(*key);
    proto::EncodeFloat32(p.values, p.shape, t->mutable_value());
    bytes += size;
  }
  return send();
}

absl::Status BulkTransfer::PushGradients(
    int64_t step, int64_t num_samples,
    const Params& grads) {
  return PushAll(step, num_samples, grads, nullptr);
}

absl::Status BulkTransfer::PushGradients(
    int64_t step, int64_t num_samples,
    std::shared_ptr<const Params> grads) {
  if (grads == nullptr) {
    return absl::InvalidArgumentError("PushGradients: null gradients");
  }
  const Params& g = *grads;
  return PushAll(step, num_samples, g, std::move(grads));
}

absl::Status BulkTransfer::PushAll(int64_t step, int64_t num_samples,
                               const Params& grads,
                               const std::shared_ptr<const void>& owner) {
  std::vector<PushEntry> entries;
  entries.reserve(grads.size());
  for (const auto& [key, p] : grads) entries.push_back(PushEntry{&key, &p});
  return PushEntries(step, num_samples, entries, owner);
}

absl::Status BulkTransfer::PushEntries(int64_t step, int64_t num_samples,
                                       const std::vector<PushEntry>& entries,
                                       const std::shared_ptr<const void>& owner) {
  if (step < 0 || num_samples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PushGradients: step ", step, " and num_samples ",
                     num_samples, " must not be negative"));
  }
  std::vector<std::vector<PushEntry>> by_shard(channels_->num_shards());
  for (const PushEntry& e : entries) {
    if (absl::Status s = CheckParam(*e.key, *e.param); !s.ok()) return s;
    by_shard[proto::ShardForKey(*e.key, channels_->num_shards())].push_back(e);
  }
  const std::vector<int> shards = ShardsWithKeys(by_shard);
  return RunParallel(static_cast<int>(shards.size()), [&](int j) {
    const int shard = shards[j];
    absl::Status s = channels_->WithRetries(shard, [&](grpc::ClientContext& context) {
      return PushShard(shard, step, num_samples, by_shard[shard], owner,
                       context);
    });
    return Annotate(s, absl::StrCat("PushGradients of step ", step, " to ",
                                    channels_->ShardName(shard)));
  });
}

absl::Status BulkTransfer::PushShard(int shard, int64_t step, int64_t num_samples,
                                 const std::vector<PushEntry>& entries,
                                 const std::shared_ptr<const void>& owner,
                                 grpc::ClientContext& context) {
  grpc::ByteBuffer response_bytes;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
          channels_->shard(shard).channel.get(), *channels_->shard(shard).push_method, &context,
          &response_bytes));

  proto::PushGradientsRequest head;
  head.set_job(channels_->options().job);
  head.set_worker(channels_->options().worker);
  head.set_step(step);
  head.set_num_samples(num_samples);
  // Each message is written as soon as it is full, so that no more than one
  // is ever held.
  proto::ChunkedMessageBuilder message(
      head, proto::PushGradientsRequest::kChunksFieldNumber,
      proto::kBulkMessageBytes);
  const auto write = [&writer](grpc::ByteBuffer m) { return writer->Write(m); };
  bool ok = true;
  for (const PushEntry& e : entries) {
    const Param& p = *e.param;
    ok = message.AddTensor(*e.key, p.shape, p.values, owner, write);
    if (!ok) break;
  }
  if (ok && message.num_chunks() > 0) ok = writer->Write(message.Build());
  // After a failed write the server has ended the call; Finish says why.
  if (ok) writer->WritesDone();
  return proto::FromGrpcStatus(writer->Finish());
}

absl::StatusOr<Params> BulkTransfer::PullParameters(
    const std::vector<std::string>& keys, int64_t min_version) {
  Params out;
  for (const std::string& key : keys) out[key];
  if (out.empty()) return out;
  if (absl::Status s = PullParametersInto(min_version, &out); !s.ok()) return s;
  return out;
}

absl::Status BulkTransfer::PullParametersInto(int64_t min_version,
                                          Params* params) {
  if (min_version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PullParameters: negative min_version ", min_version));
  }
  std::vector<int> shards;
  if (params->empty()) {
    // Every key: each shard's tensors go to a map of its own, merged after.
    std::vector<Params> got(channels_->num_shards());
    for (int i = 0; i < channels_->num_shards(); ++i) shards.push_back(i);
    absl::Status s = PullFrom(
        std::vector<std::vector<std::string>>(channels_->num_shards()), shards,
        min_version, [&got](int shard, const std::string& key) {
          return &got[shard][key];
        });
    if (!s.ok()) return s;
    for (auto& m : got) params->merge(m);  // keys are disjoint
    return absl::OkStatus();
  }
  std::vector<std::vector<std::string>> by_shard(channels_->num_shards());
  for (const auto& [key, _] : *params) {
    if (absl::Status s = CheckKey(key, "key"); !s.ok()) return s;
    by_shard[proto::ShardForKey(key, channels_->num_shards())].push_back(key);
  }
  shards = ShardsWithKeys(by_shard);
  // Only finds: safe from one thread per shard.
  return PullFrom(by_shard, shards, min_version,
                  [params](int, const std::string& key) -> Param* {
                    auto it = params->find(key);
                    return it == params->end() ? nullptr : &it->second;
                  });
}

absl::Status BulkTransfer::PullFrom(
    const std::vector<std::vector<std::string>>& keys_by_shard,
    const std::vector<int>& shards, int64_t min_version, const PullSlot& slot) {
  return RunParallel(static_cast<int>(shards.size()), [&](int j) {
    const int shard = shards[j];
    absl::Status s = channels_->WithRetries(shard, [&](grpc::ClientContext& context) {
      return PullShard(shard, keys_by_shard[shard], min_version, slot,
                       context);
    });
    return Annotate(s, absl::StrCat("PullParameters from ", channels_->ShardName(shard)));
  });
}

absl::Status BulkTransfer::PullShard(int shard,
                                 const std::vector<std::string>& keys,
                                 int64_t min_version, const PullSlot& slot,
                                 grpc::ClientContext& context) {
  proto::PullParametersRequest request;
  request.set_job(channels_->options().job);
  request.set_worker(channels_->options().worker);
  for (const std::string& key : keys) request.add_keys(key);
  request.set_min_version(min_version);
  return PullShardStream(
      *channels_, shard, request, context,
      [&](const std::string& key) { return slot(shard, key); },
      [](const std::string&) {});
}

}  // namespace bnps::client::internal
