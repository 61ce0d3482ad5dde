#include "security/call_session.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "util/sha256.h"

namespace bnps::security {
namespace {

constexpr size_t kMacBytes = 32;

absl::Status Refused(absl::string_view why) {
  return absl::UnauthenticatedError(
      absl::StrCat("the call's session (", kCallAuthMetadataKey, ") ", why));
}

bool IsLowerHex(absl::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f');
  });
}

// `s`, lower-case hex of `bytes` bytes, decoded into `out`.
bool FromHex(absl::string_view s, size_t bytes, std::string* out) {
  if (s.size() != 2 * bytes || !IsLowerHex(s)) return false;
  *out = absl::HexStringToBytes(s);
  return true;
}

}  // namespace

std::string FormatCallAuth(const CallAuth& auth) {
  return absl::StrCat(absl::Hex(auth.session, absl::kZeroPad16), ".",
                      auth.sequence, ".", util::Hex(auth.mac));
}

absl::StatusOr<CallAuth> ParseCallAuth(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, '.');
  if (parts.size() != 3) {
    return Refused("is not <session>.<sequence>.<mac>");
  }
  CallAuth out;
  std::string id;
  if (!FromHex(parts[0], sizeof(uint64_t), &id)) {
    return Refused("names no session (16 hex digits)");
  }
  for (unsigned char c : id) out.session = (out.session << 8) | c;
  const bool digits = !parts[1].empty() && parts[1].size() <= 20 &&
                      std::all_of(parts[1].begin(), parts[1].end(),
                                  [](char c) { return absl::ascii_isdigit(c); });
  if (!digits || !absl::SimpleAtoi(parts[1], &out.sequence) ||
      out.sequence == 0) {
    return Refused("has no sequence number (1 or more)");
  }
  if (!FromHex(parts[2], kMacBytes, &out.mac)) {
    return Refused("has no MAC (64 hex digits)");
  }
  return out;
}

std::string CallMac(absl::string_view session_key, absl::string_view method,
                    uint64_t sequence, int worker,
                    absl::string_view generation) {
  std::string t;
  const std::string seq = absl::StrCat(sequence);
  const std::string who = absl::StrCat(worker);
  for (absl::string_view f : {method, absl::string_view(seq),
                              absl::string_view(who), generation}) {
    absl::StrAppend(&t, f.size(), ":", f, ";");
  }
  return HandshakeProof(session_key, "call", t);
}

std::string ClientSession::Sign(absl::string_view method,
                                absl::string_view generation) {
  CallAuth auth;
  auth.session = id_;
  auth.sequence = next_.fetch_add(1);
  auth.mac = CallMac(key_, method, auth.sequence, worker_, generation);
  return FormatCallAuth(auth);
}

namespace {

proto::BnHello SessionHello(std::string job, int worker) {
  proto::BnHello hello;
  hello.set_job(std::move(job));
  hello.set_worker(worker);
  return hello;
}

}  // namespace

SessionOpener::SessionOpener(std::string job, int worker, std::string token,
                             std::string where)
    : hello_(SessionHello(std::move(job), worker), token,
             std::string(kSessionTransport), std::move(where)),
      token_(std::move(token)) {}

proto::SessionRequest SessionOpener::Open() const {
  proto::SessionRequest r;
  *r.mutable_hello() = hello_.hello();
  return r;
}

absl::StatusOr<proto::SessionRequest> SessionOpener::OnChallenge(
    const proto::SessionResponse& response) {
  absl::StatusOr<std::optional<proto::BnHelloProof>> proof =
      hello_.OnFirstReply(response.reply());
  if (!proof.ok()) return proof.status();
  if (!proof->has_value()) {
    // OnFirstReply refuses a final OK for a client with a token.
    return absl::InternalError("no challenge to answer");
  }
  session_ = response.session();
  key_ = SessionKey(token_, HelloTranscript(hello_.hello(), kSessionTransport,
                                            response.reply().server_nonce()));
  proto::SessionRequest r;
  r.set_session(session_);
  *r.mutable_proof() = **std::move(proof);
  return r;
}

std::unique_ptr<ClientSession> SessionOpener::Confirmed() const {
  return std::make_unique<ClientSession>(session_, key_,
                                         hello_.hello().worker());
}

SessionTable::SessionTable(const TokenAuthenticator* auth, Options options)
    : auth_(auth), options_(options) {}

absl::StatusOr<proto::SessionResponse> SessionTable::Handle(
    const proto::SessionRequest& request) {
  absl::MutexLock lock(&mu_);
  if (request.has_hello()) return Open(request.hello());
  if (absl::Status s = Confirm(request.session(), request.proof()); !s.ok()) {
    return s;
  }
  return proto::SessionResponse();
}

uint64_t SessionTable::NewId() const {
  uint64_t id = 0;
  while (id == 0 || pending_.count(id) != 0 || sessions_.count(id) != 0) {
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&id), sizeof(id)) != 1) {
      std::abort();  // no randomness: nothing safe to go on with
    }
  }
  return id;
}

absl::StatusOr<proto::SessionResponse> SessionTable::Open(
    const proto::BnHello& hello) {
  if (hello.worker() < -1 || hello.worker() >= options_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a session speaks for a worker in [-1, ", options_.num_workers,
        "), not ", hello.worker()));
  }
  if (hello.workers_size() != 0 || !hello.upstream().empty()) {
    return absl::InvalidArgumentError(
        "a session's hello names one worker and no upstream");
  }
  const uint64_t id = NewId();
  auto [it, added] =
      pending_.try_emplace(id, auth_, static_cast<int>(hello.worker()));
  absl::StatusOr<proto::BnHelloReply> challenge = it->second.handshake.Begin(hello);
  if (!challenge.ok() || !it->second.handshake.awaiting_proof()) {
    pending_.erase(it);
    if (!challenge.ok()) return challenge.status();
    return absl::FailedPreconditionError("this server requires no session");
  }
  pending_order_.push_back(id);
  while (pending_.size() > options_.max_pending) {
    pending_.erase(pending_order_.front());
    pending_order_.pop_front();
  }
  proto::SessionResponse r;
  r.set_session(id);
  *r.mutable_reply() = *std::move(challenge);
  return r;
}

absl::Status SessionTable::Confirm(uint64_t id,
                                   const proto::BnHelloProof& proof) {
  auto it = pending_.find(id);
  if (it == pending_.end()) {
    return absl::UnauthenticatedError(
        "no such session opening (evicted by newer ones, or the server "
        "restarted): open another");
  }
  absl::StatusOr<int> caller = it->second.handshake.Finish(proof);
  const int worker = it->second.worker;
  Session s;
  if (caller.ok()) {
    s.worker = worker;
    s.caller = *caller;
    s.key = auth_->SessionKeyOf(*caller, it->second.handshake.transcript());
  }
  pending_.erase(it);  // one proof per opening, right or wrong
  pending_order_.erase(
      std::find(pending_order_.begin(), pending_order_.end(), id));
  if (!caller.ok()) return caller.status();
  std::deque<uint64_t>& mine = by_worker_[worker];
  mine.push_back(id);
  sessions_.emplace(id, std::move(s));
  while (mine.size() > options_.sessions_per_worker) {
    sessions_.erase(mine.front());
    mine.pop_front();
  }
  return absl::OkStatus();
}

absl::Status SessionTable::Accept(Session& s, uint64_t sequence) {
  if (sequence > s.highest) {
    const uint64_t shift = sequence - s.highest;
    if (shift >= kReplayWindow) {
      s.seen.reset();
    } else {
      s.seen <<= shift;
    }
    s.seen.set(0);
    s.highest = sequence;
    return absl::OkStatus();
  }
  const uint64_t age = s.highest - sequence;
  if (age >= kReplayWindow) {
    return Refused(absl::StrCat("sequence ", sequence, " is older than the ",
                                kReplayWindow, " the session still accepts"));
  }
  if (s.seen.test(age)) {
    return Refused(absl::StrCat("sequence ", sequence,
                                " was used before: a replayed call"));
  }
  s.seen.set(age);
  return absl::OkStatus();
}

absl::StatusOr<int> SessionTable::Verify(absl::string_view call_auth,
                                         absl::string_view method,
                                         absl::string_view generation) {
  absl::StatusOr<CallAuth> auth = ParseCallAuth(call_auth);
  if (!auth.ok()) return auth.status();
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(auth->session);
  if (it == sessions_.end()) {
    return Refused(
        "is unknown here (the server restarted, or a newer session of the "
        "same worker replaced it): open another");
  }
  Session& s = it->second;
  const std::string want =
      CallMac(s.key, method, auth->sequence, s.worker, generation);
  if (CRYPTO_memcmp(want.data(), auth->mac.data(), want.size()) != 0) {
    return Refused("has a MAC that does not hold for this call");
  }
  if (absl::Status a = Accept(s, auth->sequence); !a.ok()) return a;
  return s.caller;
}

size_t SessionTable::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_.size();
}

size_t SessionTable::confirmed() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace bnps::security
