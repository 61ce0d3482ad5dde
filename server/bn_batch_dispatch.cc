#include "server/bn_batch_dispatch.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "proto/limits.h"

namespace bnps::server {

BnBatchDispatcher::BnBatchDispatcher(Shard* shard, ServerMetrics* metrics,
                                     int64_t generation,
                                     const std::vector<int>& workers,
                                     const BnDispatcher::Admit& admit) {
  for (int w : workers) {
    by_worker_.try_emplace(w, shard, metrics, generation, w, admit);
  }
}

BnDispatcher& BnBatchDispatcher::For(int worker) {
  auto it = by_worker_.find(worker);
  // Another worker's request goes to the first dispatcher, whose caller
  // check refuses it in the words it uses for every connection.
  return it != by_worker_.end() ? it->second : by_worker_.begin()->second;
}

void BnBatchDispatcher::Dispatch(const proto::BnRequest& req,
                                 BnDispatcher::Send send) {
  if (req.batch_size() == 0) {
    For(req.worker()).Dispatch(req, std::move(send));
    return;
  }
  const int n = req.batch_size();
  const uint64_t id = req.id();
  auto refuse = [&](const absl::Status& s) {
    proto::BnResponse resp;
    resp.set_id(id);
    resp.set_code(static_cast<int>(s.code()));
    resp.set_message(std::string(s.message()));
    send(resp);
  };
  if (n > static_cast<int>(by_worker_.size())) {
    refuse(absl::InvalidArgumentError(absl::StrCat(
        "a BN batch of ", n, " requests on a connection that speaks for ",
        by_worker_.size(), " workers")));
    return;
  }
  // The entries' answers, collected as they come (on any thread); the last
  // one sends the whole.
  struct Collect {
    absl::Mutex mu;
    proto::BnResponse whole ABSL_GUARDED_BY(mu);
    int left ABSL_GUARDED_BY(mu) = 0;
    BnDispatcher::Send send;
  };
  auto collect = std::make_shared<Collect>();
  {
    absl::MutexLock lock(&collect->mu);
    collect->whole.set_id(id);
    for (int i = 0; i < n; ++i) collect->whole.add_batch();
    collect->left = n;
  }
  collect->send = std::move(send);
  for (int i = 0; i < n; ++i) {
    const proto::BnRequest& entry = req.batch(i);
    auto answer = [collect, i](const proto::BnResponse& resp) {
      proto::BnResponse whole;
      {
        absl::MutexLock lock(&collect->mu);
        *collect->whole.mutable_batch(i) = resp;
        if (--collect->left > 0) return;
        whole = std::move(collect->whole);
      }
      if (whole.ByteSizeLong() > static_cast<size_t>(proto::kMaxMessageBytes)) {
        const uint64_t id = whole.id();
        whole.Clear();
        whole.set_id(id);
        whole.set_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
        whole.set_message(absl::StrCat(
            "the answers to a BN batch would take more than a message may (",
            proto::kMaxMessageBytes, " bytes); send its requests one by one"));
      }
      collect->send(whole);
    };
    if (entry.batch_size() > 0) {
      proto::BnResponse nested;
      nested.set_id(entry.id());
      nested.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
      nested.set_message("a BN batch inside a BN batch");
      answer(nested);
      continue;
    }
    For(entry.worker()).Dispatch(entry, std::move(answer));
  }
}

}  // namespace bnps::server
