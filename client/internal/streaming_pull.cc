#include "client/internal/streaming_pull.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/internal/bulk_transfer.h"
#include "proto/sharding.h"

namespace bnps::client::internal {

StreamingPull::StreamingPull(Channels* channels, TaskThreads* threads,
                             int64_t min_version,
                             const std::vector<std::string>& keys,
                             Params* into, absl::Status refused)
    : channels_(channels),
      min_version_(min_version),
      refused_([&]() -> absl::Status {
        if (!refused.ok()) return refused;
        if (min_version < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "PullParameters: negative min_version ", min_version));
        }
        if (absl::Status s = CheckPullKeys(keys); !s.ok()) return s;
        for (const std::string& key : keys) {
          if (absl::Status s = CheckKey(key, "key"); !s.ok()) return s;
        }
        return absl::OkStatus();
      }()),
      order_(keys),
      shards_(channels->num_shards()) {
  if (!refused_.ok()) return;
  KeepOnly(keys, into);
  for (const std::string& key : keys) {
    const int shard = proto::ShardForKey(key, channels_->num_shards());
    keys_[key] = Key{shard, &into->at(key)};
    shards_[shard].keys.push_back(key);
  }
  for (int shard = 0; shard < channels_->num_shards(); ++shard) {
    if (shards_[shard].keys.empty()) {
      shards_[shard].ended = true;
      continue;
    }
    auto done = std::make_shared<absl::Notification>();
    calls_done_.push_back(done);
    threads->Run(shard, [this, shard, done] {
      Run(shard);
      done->Notify();  // the last touch of this pull
    });
  }
}

void StreamingPull::AwaitCalls() {
  for (const std::shared_ptr<absl::Notification>& done : calls_done_) {
    done->WaitForNotification();
  }
  calls_done_.clear();
}

StreamingPull::~StreamingPull() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    for (ShardCall& c : shards_) {
      if (c.context != nullptr) c.context->TryCancel();
    }
  }
  AwaitCalls();
}

void StreamingPull::Run(int shard) {
  absl::Status s = channels_->WithRetries(
      shard, [&](grpc::ClientContext& context) { return Attempt(shard, context); });
  s = Annotate(s, absl::StrCat("PullParameters from ",
                               channels_->ShardName(shard)));
  absl::MutexLock lock(&mu_);
  shards_[shard].ended = true;
  shards_[shard].status = s;
}

absl::Status StreamingPull::Attempt(int shard, grpc::ClientContext& context) {
  proto::PullParametersRequest request;
  request.set_job(channels_->options().job);
  request.set_worker(channels_->options().worker);
  request.set_min_version(min_version_);
  request.set_in_order(true);
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return absl::CancelledError("the pull was abandoned");
    for (const std::string& key : shards_[shard].keys) {
      if (!keys_.at(key).in) request.add_keys(key);
    }
    // Every key came in an attempt that then failed: nothing to ask for.
    if (request.keys_size() == 0) return absl::OkStatus();
    shards_[shard].context = &context;
  }
  struct Unregister {
    StreamingPull* pull;
    int shard;
    ~Unregister() {
      absl::MutexLock lock(&pull->mu_);
      pull->shards_[shard].context = nullptr;
    }
  } unregister{this, shard};

  return PullShardStream(
      *channels_, shard, request, context,
      // Only this thread writes the entry, and no one reads it before it is
      // marked in.
      [&](const std::string& key) { return keys_.at(key).param; },
      [&](const std::string& key) {
        absl::MutexLock lock(&mu_);
        keys_.at(key).in = true;
      });
}

std::optional<absl::Status> StreamingPull::KeyStatus(const Key& k) const {
  if (k.in) return absl::OkStatus();
  const ShardCall& c = shards_[k.shard];
  if (!c.ended) return std::nullopt;
  if (!c.status.ok()) return c.status;
  // Cannot happen: an OK call brought every key it asked for.
  return absl::InternalError("the shard's call ended without the key");
}

absl::Status StreamingPull::Wait(const std::string& key) {
  if (!refused_.ok()) return refused_;
  auto it = keys_.find(key);
  if (it == keys_.end()) {
    return absl::NotFoundError(
        absl::StrCat("key '", key, "' is not part of this pull"));
  }
  const Key& k = it->second;
  absl::MutexLock lock(&mu_);
  auto known = [this, &k]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return KeyStatus(k).has_value();
  };
  mu_.Await(absl::Condition(&known));
  return *KeyStatus(k);
}

absl::Status StreamingPull::Finish() {
  if (!refused_.ok()) return refused_;
  AwaitCalls();
  absl::MutexLock lock(&mu_);
  for (const std::string& key : order_) {
    if (absl::Status s = *KeyStatus(keys_.at(key)); !s.ok()) return s;
  }
  for (const ShardCall& c : shards_) {
    if (!c.status.ok()) return c.status;
  }
  return absl::OkStatus();
}

}  // namespace bnps::client::internal
