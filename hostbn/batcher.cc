#include "hostbn/batcher.h"

#include "absl/strings/str_cat.h"

namespace bnps::hostbn {
namespace {

// Rounds remembered as sent: a repeat of an older one also leaves at once
// (held, it would wait for workers that were answered long ago).
constexpr size_t kSentMemory = 4096;

bool IsBarrier(proto::BnPhase phase) {
  return phase == proto::BN_FORWARD || phase == proto::BN_BACKWARD ||
         phase == proto::BN_RECAL_FINISH || phase == proto::BN_LOCAL_RUNNING;
}

}  // namespace

Batcher::Batcher(int workers) : workers_(workers) {}

proto::BnResponse Batcher::Error(uint64_t id, const absl::Status& s) {
  proto::BnResponse resp;
  resp.set_id(id);
  resp.set_code(static_cast<int>(s.code()));
  resp.set_message(std::string(s.message()));
  return resp;
}

bool Batcher::Complete(const std::map<int, proto::BnRequest>& round) const {
  // Every worker that has not gone contributed (those gone may have too).
  int present = 0;
  for (const auto& [w, r] : round) present += gone_.count(w) == 0 ? 1 : 0;
  return present >= workers_ - static_cast<int>(gone_.size());
}

proto::BnRequest Batcher::Send(const Key& key,
                               std::map<int, proto::BnRequest> round) {
  std::vector<std::pair<int, proto::BnRequest>> all;
  for (auto& [w, r] : round) all.emplace_back(w, std::move(r));  // in order
  sent_.insert(key);
  sent_order_.push_back(key);
  if (sent_order_.size() > kSentMemory) {
    sent_.erase(sent_order_.front());
    sent_order_.pop_front();
  }
  return Frame(std::move(all));
}

proto::BnRequest Batcher::Frame(
    std::vector<std::pair<int, proto::BnRequest>> reqs) {
  proto::BnRequest frame;
  const uint64_t id = next_id_++;
  frame.set_id(id);
  std::vector<Entry>& entries = outstanding_[id];
  for (auto& [worker, req] : reqs) {
    entries.push_back(Entry{worker, req.id()});
    *frame.add_batch() = std::move(req);
  }
  return frame;
}

void Batcher::Join(int worker) { gone_.erase(worker); }

Batcher::Out Batcher::Submit(int worker, proto::BnRequest req) {
  Out out;
  const Key key{req.layer(), static_cast<int>(req.phase()), req.step()};
  auto held = held_.find(key);
  const bool repeat =
      sent_.count(key) > 0 ||
      (held != held_.end() && held->second.count(worker) > 0);
  if (!IsBarrier(req.phase()) || repeat || workers_ == 1) {
    std::vector<std::pair<int, proto::BnRequest>> one;
    one.emplace_back(worker, std::move(req));
    out.upstream.push_back(Frame(std::move(one)));
    return out;
  }
  if (held == held_.end() &&
      static_cast<int>(held_.size()) >= kMaxHeldRounds) {
    out.answers.emplace_back(
        worker, Error(req.id(), absl::ResourceExhaustedError(absl::StrCat(
                                    "this host's BN aggregator holds ",
                                    kMaxHeldRounds,
                                    " rounds waiting for workers already"))));
    return out;
  }
  std::map<int, proto::BnRequest>& round = held_[key];
  round.emplace(worker, std::move(req));
  if (!Complete(round)) return out;
  std::map<int, proto::BnRequest> done = std::move(round);
  held_.erase(key);
  out.upstream.push_back(Send(key, std::move(done)));
  return out;
}

Batcher::Out Batcher::Leave(int worker) {
  Out out;
  gone_.insert(worker);
  // The rounds only it held up leave without it: the shard waits for its
  // contribution (it may repeat it on another connection) or fails the
  // barrier naming it, as when each worker sends its own.
  for (auto it = held_.begin(); it != held_.end();) {
    if (!Complete(it->second)) {
      ++it;
      continue;
    }
    out.upstream.push_back(Send(it->first, std::move(it->second)));
    it = held_.erase(it);
  }
  return out;
}

std::vector<std::pair<int, proto::BnResponse>> Batcher::Answer(
    const proto::BnResponse& resp) {
  std::vector<std::pair<int, proto::BnResponse>> out;
  auto it = outstanding_.find(resp.id());
  if (it == outstanding_.end()) return out;
  const std::vector<Entry> entries = std::move(it->second);
  outstanding_.erase(it);
  for (size_t i = 0; i < entries.size(); ++i) {
    if (resp.code() != 0 || static_cast<int>(i) >= resp.batch_size()) {
      // The batch failed as a whole (or the shard answered fewer entries
      // than it was sent): each entry gets the whole's error.
      const absl::Status why =
          resp.code() != 0
              ? absl::Status(static_cast<absl::StatusCode>(resp.code()),
                             resp.message())
              : absl::InternalError("the shard's answer to a BN batch "
                                    "lacked this request's");
      out.emplace_back(entries[i].worker, Error(entries[i].id, why));
    } else {
      out.emplace_back(entries[i].worker, resp.batch(static_cast<int>(i)));
    }
  }
  return out;
}

Batcher::Out Batcher::Fail(const absl::Status& why) {
  Out out;
  for (const auto& [key, round] : held_) {
    for (const auto& [w, r] : round) {
      out.answers.emplace_back(w, Error(r.id(), why));
    }
  }
  held_.clear();
  for (const auto& [id, entries] : outstanding_) {
    for (const Entry& e : entries) {
      out.answers.emplace_back(e.worker, Error(e.id, why));
    }
  }
  outstanding_.clear();
  return out;
}

}  // namespace bnps::hostbn
