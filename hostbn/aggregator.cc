#include "hostbn/aggregator.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hostbn/batcher.h"
#include "hostbn/conn.h"
#include "proto/bn_frame.h"
#include "proto/bnps.pb.h"
#include "proto/limits.h"
#include "security/bn_handshake.h"
#include "util/log_escape.h"
#include "util/socket_io.h"

namespace bnps::hostbn {
namespace {

// More than any hello (a token of at most 4,096 characters, a job name, a
// shard's address) before the hello is whole: not a worker; closed.
constexpr size_t kMaxHelloBytes = 64 * 1024;
static_assert(Aggregator::kMaxQueuedBytes >=
              2 * static_cast<size_t>(proto::kMaxMessageBytes));

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", strerror(errno)));
}

}  // namespace

// The workers of one (shard, job, generation) and their shard connection.
struct Aggregator::Group {
  Group(GroupKey key, int workers, AggregatorMetrics* metrics)
      : key(std::move(key)), metrics(metrics), batcher(workers) {}

  // Queues what `out` says (frames to the shard, answers to workers) on
  // their connections, whose own threads write them.
  void Deliver(Batcher::Out out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (metrics != nullptr) {
      metrics->Frames(AggregatorMetrics::kToShards,
                      static_cast<int64_t>(out.upstream.size()));
    }
    for (proto::BnRequest& frame : out.upstream) {
      if (upstream != nullptr) {
        upstream->Send(frame);
      } else {
        queued.push_back(std::move(frame));
      }
    }
    Answer(out.answers);
  }
  void Answer(const std::vector<std::pair<int, proto::BnResponse>>& answers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (const auto& [worker, resp] : answers) {
      auto it = conns.find(worker);
      if (it == conns.end()) continue;
      // Counted first: whoever reads the answer sees it counted.
      if (metrics != nullptr) metrics->Frames(AggregatorMetrics::kToWorkers);
      it->second->Send(resp);
    }
  }
  const std::string& address() const { return std::get<0>(key); }

  const GroupKey key;  // upstream address, job, generation
  AggregatorMetrics* const metrics;  // not owned; may be null
  absl::Mutex mu;
  Batcher batcher ABSL_GUARDED_BY(mu);
  std::map<int, std::shared_ptr<Conn>> conns ABSL_GUARDED_BY(mu);
  std::set<int> joined ABSL_GUARDED_BY(mu);  // said hello, in id order
  std::shared_ptr<Conn> upstream ABSL_GUARDED_BY(mu);
  bool opening ABSL_GUARDED_BY(mu) = false;
  // Frames for the shard before its connection is open.
  std::vector<proto::BnRequest> queued ABSL_GUARDED_BY(mu);
  absl::Status broken ABSL_GUARDED_BY(mu);
};

Aggregator::Aggregator(Options options) : options_(std::move(options)) {}

bool Aggregator::IsOwnShard(const std::string& upstream) const {
  if (options_.shards.empty()) return true;
  if (options_.shards.count(upstream) > 0) return true;
  const size_t colon = upstream.rfind(':');
  return colon != std::string::npos &&
         options_.shards.count(upstream.substr(0, colon)) > 0;
}

absl::StatusOr<std::unique_ptr<Aggregator>> Aggregator::Start(
    Options options) {
  if (options.workers < 1) {
    return absl::InvalidArgumentError("a host's BN aggregator needs workers >= 1");
  }
  if (options.per_worker_tokens &&
      (options.token.empty() || options.num_workers < 1)) {
    return absl::InvalidArgumentError(
        "per-worker tokens need the job token and the job's worker count");
  }
  std::unique_ptr<Aggregator> a(new Aggregator(std::move(options)));
  a->auth_ = std::make_unique<security::TokenAuthenticator>(
      a->options_.token, a->options_.per_worker_tokens,
      a->options_.num_workers);
  absl::StatusOr<sockaddr_in> addr =
      util::ResolveIPv4(a->options_.host, a->options_.port);
  absl::StatusOr<util::Listener> listener =
      addr.ok() ? util::ListenTcp(*addr, 256) : addr.status();
  if (!listener.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "host BN aggregator: ", listener.status().message()));
  }
  a->listen_fd_ = listener->fd;
  a->port_ = listener->port;
  a->Spawn([p = a.get()] { p->AcceptLoop(); });
  return a;
}

Aggregator::~Aggregator() {
  Stop();
  if (listen_fd_ >= 0) close(listen_fd_);
}

void Aggregator::Spawn(std::function<void()> body) {
  std::vector<std::thread> ended;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    ended = TakeEndedThreads();
    const int64_t id = next_thread_++;
    // The thread cannot record its end before it is in threads_: mu_ is
    // held until then.
    threads_[id] = std::thread([this, id, body = std::move(body)] {
      body();
      absl::MutexLock lock(&mu_);
      ended_.push_back(id);
    });
  }
  for (std::thread& t : ended) t.join();
}

std::vector<std::thread> Aggregator::TakeEndedThreads() {
  std::vector<std::thread> ended;
  for (int64_t id : ended_) {
    auto it = threads_.find(id);
    ended.push_back(std::move(it->second));
    threads_.erase(it);
  }
  ended_.clear();
  return ended;
}

bool Aggregator::AllThreadsEnded() const {
  return ended_.size() == threads_.size();
}

void Aggregator::Stop() {
  std::vector<std::thread> ended;
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      stopping_ = true;
      shutdown(listen_fd_, SHUT_RDWR);  // wakes the accepting thread
      for (const auto& c : conns_) c->Shut();
    }
    mu_.Await(absl::Condition(this, &Aggregator::AllThreadsEnded));
    ended = TakeEndedThreads();
  }
  // Joined, not detached: a thread has wholly ended (its thread-local
  // state, OpenSSL's among it, freed) before Stop returns.
  for (std::thread& t : ended) t.join();
}

void Aggregator::AcceptLoop() {
  for (;;) {
    if (!util::WaitReadable(listen_fd_, absl::InfiniteFuture())) continue;
    const int fd =
        accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        absl::SleepFor(absl::Milliseconds(100));
        continue;
      }
      return;  // shut by Stop (EINVAL)
    }
    auto conn = std::make_shared<Conn>(fd, options_.timeout, kMaxQueuedBytes);
    if (!util::SetLowLatency(fd, "host BN aggregator").ok()) continue;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      if (pending_ >= options_.max_unauthenticated ||
          static_cast<int>(conns_.size()) >= options_.max_connections) {
        refused_.fetch_add(1);
        continue;  // closes fd: no thread for it
      }
      ++pending_;
      conns_.insert(conn);
    }
    Spawn([this, conn] {
      Serve(conn);
      absl::MutexLock lock(&mu_);
      conns_.erase(conn);
    });
  }
}

absl::Status Aggregator::Authenticate(Conn* conn, const proto::BnHello& hello,
                                      bool* gone) {
  // The handshake (security/bn_handshake.h): the aggregator proves it
  // holds the key before the worker proves it does; no token is sent.
  security::HelloServer handshake(auth_.get(), "tcp");
  absl::StatusOr<proto::BnHelloReply> first = handshake.Begin(hello);
  if (!first.ok() || !handshake.awaiting_proof()) return first.status();
  conn->WriteNow(*first);
  absl::StatusOr<std::string> bytes =
      conn->ReadFrame(absl::Now() + options_.timeout, kMaxHelloBytes);
  if (!bytes.ok()) {
    *gone = true;
    return bytes.status();
  }
  proto::BnHelloProof proof;
  absl::StatusOr<int> who =
      proof.ParseFromString(*bytes)
          ? handshake.Finish(proof)
          : absl::StatusOr<int>(absl::InvalidArgumentError(
                "the frame after the challenge is no BnHelloProof"));
  if (who.ok() && *who != security::TokenAuthenticator::kAnyWorker &&
      *who != hello.worker()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "worker ", *who, "'s token said hello as worker ", hello.worker()));
  }
  return who.status();
}

absl::Status Aggregator::CheckUpstream(const proto::BnHello& hello) const {
  if (hello.upstream().empty() || hello.workers_size() > 0) {
    return absl::InvalidArgumentError(
        "a host's BN aggregator needs a hello of one worker naming its "
        "shard's BN address (upstream)");
  }
  if (!IsOwnShard(hello.upstream())) {
    // No relay to an address a worker names: only the shards it was
    // started for.
    return absl::PermissionDeniedError(absl::StrCat(
        "'", util::EscapeForLog(hello.upstream(), 64),
        "' is not one of this aggregator's shards (bnps_host_bn --shards)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Aggregator::Group>> Aggregator::JoinGroup(
    const proto::BnHello& hello, std::shared_ptr<Conn> conn, bool* open) {
  const int worker = hello.worker();
  std::shared_ptr<Group> g;
  {
    absl::MutexLock lock(&mu_);
    GroupKey key{hello.upstream(), hello.job(), hello.generation()};
    std::shared_ptr<Group>& slot = groups_[key];
    if (slot == nullptr) {
      slot = std::make_shared<Group>(key, options_.workers, options_.metrics);
    }
    g = slot;
  }
  absl::MutexLock lock(&g->mu);
  if (!g->broken.ok()) return g->broken;
  if (g->joined.count(worker) == 0 &&
      static_cast<int>(g->joined.size()) >= options_.workers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this host's BN aggregator serves ", options_.workers,
        " workers for the shard at ", g->address(), " (workers ",
        absl::StrJoin(g->joined, ", "), "), not worker ", worker));
  }
  auto& slot = g->conns[worker];
  if (slot != nullptr) slot->Shut();  // its reconnection replaces it
  slot = std::move(conn);
  g->batcher.Join(worker);
  g->joined.insert(worker);
  *open = static_cast<int>(g->joined.size()) == options_.workers &&
          g->upstream == nullptr && !g->opening;
  if (*open) g->opening = true;
  // Queued under the group's lock: ahead of any answer to this worker.
  // Counted before the reply: whoever reads it sees it counted.
  if (options_.metrics != nullptr) options_.metrics->HelloAccepted();
  slot->Send(proto::BnHelloReply());  // code 0: accepted
  return g;
}

void Aggregator::Relay(const std::shared_ptr<Conn>& conn, int worker,
                       const std::shared_ptr<Group>& g) {
  AggregatorMetrics* const m = options_.metrics;
  for (;;) {
    absl::StatusOr<std::string> frame = conn->ReadFrame(absl::InfiniteFuture());
    if (!frame.ok()) break;
    proto::BnRequest req;
    if (!req.ParseFromString(*frame)) break;  // not ours: closed
    if (m != nullptr) m->Frames(AggregatorMetrics::kFromWorkers);
    absl::MutexLock lock(&g->mu);
    absl::Status refused = g->broken;
    if (refused.ok() && (req.worker() != worker || req.batch_size() > 0)) {
      refused = absl::PermissionDeniedError(absl::StrCat(
          "this BN connection acts as worker ", worker,
          " alone (a request of worker ", req.worker(),
          req.batch_size() > 0 ? ", a batch" : "", ")"));
    }
    if (!refused.ok()) {
      proto::BnResponse resp;
      resp.set_id(req.id());
      resp.set_code(static_cast<int>(refused.code()));
      resp.set_message(std::string(refused.message()));
      conn->Send(resp);
      continue;
    }
    g->Deliver(g->batcher.Submit(worker, std::move(req)));
  }
  if (m != nullptr) m->WorkerGone();
  absl::MutexLock lock(&g->mu);
  auto it = g->conns.find(worker);
  if (it != g->conns.end() && it->second == conn) {
    g->conns.erase(it);
    g->Deliver(g->batcher.Leave(worker));
  }
}

void Aggregator::Serve(std::shared_ptr<Conn> conn) {
  // Counted among those before their hello until it is settled.
  bool pending = true;
  auto settled = [this, &pending] {
    if (!pending) return;
    pending = false;
    absl::MutexLock lock(&mu_);
    --pending_;
  };
  struct Settle {
    std::function<void()> f;
    ~Settle() { f(); }
  } settle{settled};
  proto::BnHello hello;
  absl::Status s;
  absl::StatusOr<std::string> first =
      conn->ReadFrame(absl::Now() + options_.timeout, kMaxHelloBytes);
  if (!first.ok()) return;
  if (!hello.ParseFromString(*first)) {
    s = absl::InvalidArgumentError("the first frame is no BnHello");
  }
  const int worker = hello.worker();
  if (s.ok()) {
    bool gone = false;
    s = Authenticate(conn.get(), hello, &gone);
    if (gone) return;
  }
  if (s.ok()) s = CheckUpstream(hello);
  std::shared_ptr<Group> g;
  bool open = false;
  if (s.ok()) {
    absl::StatusOr<std::shared_ptr<Group>> joined = JoinGroup(hello, conn, &open);
    s = joined.status();
    if (joined.ok()) g = *std::move(joined);
  }
  if (!s.ok()) {
    proto::BnHelloReply reply;
    reply.set_code(static_cast<int>(s.code()));
    reply.set_message(std::string(s.message()));
    // Counted before the reply: whoever reads it sees it counted.
    if (options_.metrics != nullptr) options_.metrics->HelloRefused();
    conn->WriteNow(reply);  // in no group: nothing else is queued on it
  }
  settled();
  if (!s.ok()) {
    int64_t left_out = 0;
    if (refusal_log_.Admit(absl::Now(), &left_out)) {
      std::fprintf(stderr, "bnps_host_bn: refused worker %d: %s%s\n", worker,
                   util::EscapeForLog(s.message()).c_str(),
                   util::LogLimiter::LeftOut(left_out).c_str());
    }
    return;
  }
  // On a thread of its own: this one writes the hello reply JoinGroup
  // queued while the shard's connection opens.
  if (open) Spawn([this, g] { OpenUpstream(g); });
  Relay(conn, worker, g);
}

void Aggregator::OpenUpstream(const std::shared_ptr<Group>& g) {
  const std::string& where = g->address();
  proto::BnHello hello;
  hello.set_job(std::get<1>(g->key));
  hello.set_generation(std::get<2>(g->key));
  {
    absl::MutexLock lock(&g->mu);
    hello.set_worker(*g->joined.begin());
    for (int w : g->joined) hello.add_workers(w);
  }
  const absl::Time deadline = absl::Now() + options_.timeout;
  auto fail = [&](const absl::Status& st) {
    Break(g, absl::UnavailableError(absl::StrCat(
                 "the shard's BN listener at ", where, ": ", st.message())));
  };
  const size_t colon = where.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(where.substr(colon + 1), &port)) {
    return fail(absl::InvalidArgumentError("not a host:port"));
  }
  absl::StatusOr<sockaddr_in> addr =
      util::ResolveIPv4(where.substr(0, colon), port);
  if (!addr.ok()) return fail(addr.status());
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(Errno("socket"));
  auto up = std::make_shared<Conn>(fd, options_.timeout, kMaxQueuedBytes);
  if (absl::Status st = util::SetLowLatency(fd, "BN upstream"); !st.ok()) {
    return fail(st);
  }
  if (connect(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof *addr) != 0) {
    if (errno != EINPROGRESS) return fail(Errno("connect"));
    if (absl::Status st = util::FinishConnect(fd, deadline); !st.ok()) {
      return fail(st);
    }
  }
  bool stopping = false;
  {
    absl::MutexLock lock(&mu_);
    stopping = stopping_;
    if (!stopping) conns_.insert(up);
  }
  // Failed outside mu_: Break takes it (a stop while a shard connection
  // opened once died here on a self-deadlock).
  if (stopping) return fail(absl::CancelledError("stopping"));
  // The shard proves it holds the job token before the aggregator proves it
  // does; the token itself is never sent.
  const security::HelloClient handshake(hello, options_.token, "tcp", where);
  up->WriteNow(handshake.hello());
  proto::BnHelloReply reply;
  auto read_reply = [&]() -> absl::Status {
    absl::StatusOr<std::string> bytes = up->ReadFrame(deadline);
    if (!bytes.ok()) return bytes.status();
    if (!reply.ParseFromString(*bytes)) {
      return absl::InvalidArgumentError("no BnHelloReply");
    }
    return absl::OkStatus();
  };
  if (absl::Status st = read_reply(); !st.ok()) return fail(st);
  absl::StatusOr<std::optional<proto::BnHelloProof>> proof =
      handshake.OnFirstReply(reply);
  if (!proof.ok()) return fail(proof.status());
  if (proof->has_value()) {
    up->WriteNow(**proof);
    if (absl::Status st = read_reply(); !st.ok()) return fail(st);
  }
  if (reply.code() != 0) {
    return fail(absl::Status(static_cast<absl::StatusCode>(reply.code()),
                             reply.message()));
  }
  {
    absl::MutexLock lock(&g->mu);
    if (!g->broken.ok()) return;
    g->upstream = up;
    g->opening = false;
    for (const proto::BnRequest& frame : g->queued) up->Send(frame);
    g->queued.clear();
  }
  if (options_.metrics != nullptr) options_.metrics->ShardConnected();
  Spawn([this, g] { ReadUpstream(g); });
}

void Aggregator::ReadUpstream(std::shared_ptr<Group> g) {
  std::shared_ptr<Conn> up;
  {
    absl::MutexLock lock(&g->mu);
    up = g->upstream;
  }
  absl::Status why;
  for (;;) {
    absl::StatusOr<std::string> frame = up->ReadFrame(absl::InfiniteFuture());
    if (!frame.ok()) {
      why = frame.status();
      break;
    }
    proto::BnResponse resp;
    if (!resp.ParseFromString(*frame)) {
      why = absl::InvalidArgumentError("bytes that are no BnResponse");
      break;
    }
    if (options_.metrics != nullptr) {
      options_.metrics->Frames(AggregatorMetrics::kFromShards);
    }
    absl::MutexLock lock(&g->mu);
    g->Answer(g->batcher.Answer(resp));
  }
  if (options_.metrics != nullptr) options_.metrics->ShardGone();
  Break(g, absl::UnavailableError(absl::StrCat(
               "the BN connection to the shard at ", g->address(),
               " broke: ", why.message())));
  absl::MutexLock lock(&mu_);
  conns_.erase(up);
}

void Aggregator::Break(const std::shared_ptr<Group>& g,
                       const absl::Status& why) {
  {
    absl::MutexLock lock(&g->mu);
    if (!g->broken.ok()) return;
    g->broken = why;
    if (g->metrics != nullptr) g->metrics->ShardBroke();
    g->Deliver(g->batcher.Fail(why));
    g->queued.clear();  // their entries were answered by Fail
    // The failure answers queued above reach the workers first.
    for (auto& [w, c] : g->conns) c->CloseWhenFlushed();
    if (g->upstream != nullptr) g->upstream->Shut();
  }
  std::fprintf(stderr, "bnps_host_bn: %s\n", std::string(why.message()).c_str());
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(g->key);
  if (it != groups_.end() && it->second == g) groups_.erase(it);
}

}  // namespace bnps::hostbn
