#include "worker/ps_client.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <set>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/types/span.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpc/support/time.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/async_stream.h"
#include "grpcpp/support/sync_stream.h"
#include "proto/bn_wire.h"
#include "proto/codec.h"
#include "proto/job_token.h"
#include "proto/limits.h"
#include "proto/sharding.h"
#include "proto/tensor_wire.h"

namespace bnps::worker {
namespace {

// Backoffs between attempts double up to this.
constexpr absl::Duration kMaxBackoff = absl::Seconds(2);
// Channels reconnect at most this long after a failed connection attempt
// (gRPC's default is 120 s, far too long for a restarted shard).
constexpr int kMaxReconnectBackoffMs = 2000;
// InitParameters packs tensors into messages of at most this many bytes.
constexpr size_t kInitMessageBytes = proto::kMaxMessageBytes - 4096;
// The bulk methods' full names, for raw calls (proto/bnps.proto).
constexpr char kPushMethod[] = "/bnps.proto.ParameterServer/PushGradients";
constexpr char kPullMethod[] = "/bnps.proto.ParameterServer/PullParameters";
constexpr char kBnMethod[] = "/bnps.proto.ParameterServer/BnSync";
// Upper bound of the bytes a NamedTensor adds beyond its float
// payload, key and shape (tags, lengths, dtype, offset).
constexpr size_t kTensorOverheadBytes = 64;
// How often the background thread looks for BN writes stuck past their
// deadline.
constexpr absl::Duration kWatchdogTick = absl::Milliseconds(100);
// The destructor waits at most this long for servers to end the BN streams.
constexpr absl::Duration kCloseGrace = absl::Seconds(1);

absl::Status Annotate(const absl::Status& s, absl::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

absl::Status Malformed(absl::string_view from, const absl::Status& s) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed response from ", from, ": ", s.message()));
}

bool IsRetryable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable ||
         code == absl::StatusCode::kAborted;
}

// The head of a BN request; BnCall adds the job, the worker and the id.
proto::BnRequest BnHead(const std::string& layer, proto::BnPhase phase,
                        int64_t step = 0) {
  proto::BnRequest head;
  head.set_layer(layer);
  head.set_phase(phase);
  head.set_step(step);
  return head;
}

// Sets a call's deadline and, if the job has one, its token.
void SetUp(grpc::ClientContext* context, const std::string& token,
           absl::Time deadline) {
  context->set_deadline(absl::ToChronoTime(deadline));
  if (!token.empty()) {
    context->AddMetadata(std::string(proto::kTokenMetadataKey), token);
  }
}

absl::Status CheckKey(const std::string& key, absl::string_view what) {
  if (key.empty() || key.size() > static_cast<size_t>(proto::kMaxKeyBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", key, "' must have 1 to ", proto::kMaxKeyBytes, " bytes"));
  }
  return absl::OkStatus();
}

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

// Runs fn(0) .. fn(n - 1) on n threads (fn(0) on the caller's) and returns the
// first error in index order.
absl::Status RunParallel(int n, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> results(n);
  std::vector<std::thread> threads;
  threads.reserve(n > 0 ? n - 1 : 0);
  for (int i = 1; i < n; ++i) {
    threads.emplace_back([&results, &fn, i] { results[i] = fn(i); });
  }
  if (n > 0) results[0] = fn(0);
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// A deadline for gRPC's completion queue. (gRPC reads a system_clock time
// before the epoch, such as absl::ToChronoTime(absl::InfinitePast()), as
// "never".)
gpr_timespec ToGprTime(absl::Time t) {
  if (t == absl::InfiniteFuture()) return gpr_inf_future(GPR_CLOCK_REALTIME);
  if (t <= absl::UnixEpoch()) return gpr_time_0(GPR_CLOCK_REALTIME);
  const timespec ts = absl::ToTimespec(t);
  gpr_timespec out;
  out.tv_sec = ts.tv_sec;
  out.tv_nsec = static_cast<int32_t>(ts.tv_nsec);
  out.clock_type = GPR_CLOCK_REALTIME;
  return out;
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

absl::Status CheckChannels(int64_t got, int64_t want, absl::string_view what) {
  if (got == 0 || got != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " have ", got, " and ", want,
                     " channels; need the same non-zero ", "number"));
  }
  return absl::OkStatus();
}

absl::Status CheckSums(const bn::BackwardSums& s) {
  return CheckChannels(s.sum_dy.size(), s.sum_dy_xhat.size(),
                       "local backward sums: sum_dy and sum_dy_xhat");
}

absl::Status CheckRunning(const bn::RunningStats& r) {
  return CheckChannels(r.mean.size(), r.var.size(),
                       "running stats: mean and var");
}

}  // namespace

// One BnSync stream to one shard, driven through gRPC's completion-queue API
// by the callers themselves: the stream has no thread of its own.
//
// A read is armed while any call waits for its answer (and for the end of
// the stream once it is being closed). An answer that leaves no call waiting
// does not re-arm it (a read armed for a call that gave up at its deadline
// stays armed until its late answer comes): the next call arms it right
// after writing its request, so that the window
// update gRPC sends for the last answer leaves in the request's packet rather
// than in one of its own (strace: 1.1 sends per call instead of 2). A stream
// that ended while idle is found by that next call, which fails with `retry`
// and is repeated on a fresh stream.
//
// One thread at a time polls: the holder of the poller token (`polling_`). A
// thread that must wait -- a caller for its answer or for the write ahead of
// its own, WaitFinished and the destructor for the end of the stream -- takes
// the token if it is free and polls with its own deadline; otherwise it sleeps
// on mu_ until what it waits for has happened or the token is free again. The
// poller handles every event it takes: it hands an answer to the call with the
// answer's id (waking that caller if it is another thread), marks the write
// done, starts Finish once the read fails and, when the stream has ended, fails
// every waiting call. In training one thread makes BN calls one after another,
// so a caller nearly always polls for itself and reads its own answer without
// waking any other thread.
//
// Callers write one at a time (`writing_`; gRPC allows one write and one read
// in flight). Once the stream has ended, or a write failed, it is `broken` and
// PsClient opens a new one for later calls. An answer whose caller gave up at
// its deadline is dropped.
class PsClient::BnStream {
 public:
  struct Outcome {
    absl::Status status;
    // The stream broke under the call: repeating it on a fresh stream is safe.
    bool retry = false;
    grpc::ByteBuffer response;  // a BnResponse, framed as proto/bn_wire reads
  };

  BnStream(const std::shared_ptr<grpc::Channel>& channel,
           const std::string& token) {
    if (!token.empty()) {
      context_.AddMetadata(std::string(proto::kTokenMetadataKey), token);
    }
    // Corked: opening never blocks (the metadata goes out with the first
    // write, which the watchdog bounds). While the metadata is corked,
    // StartCall posts no event of its own: the first write carries it.
    context_.set_initial_metadata_corked(true);
    stream_ =
        grpc::GenericStub(channel).PrepareCall(&context_, kBnMethod, &cq_);
    stream_->StartCall(TagOf(Tag::kStart));
    // No read yet: the first call arms it after its write, as every call does.
  }

  BnStream(const BnStream&) = delete;
  BnStream& operator=(const BnStream&) = delete;

  // Cancels the call and polls until every operation started on it has
  // completed (promptly, once cancelled), then shuts the queue down.
  // REQUIRES: no other thread uses the stream.
  ~BnStream() {
    Cancel("the client closed the stream");
    {
      absl::MutexLock lock(&mu_);
      ArmRead();  // its failure starts Finish
      Drive(absl::Condition(this, &BnStream::Drained), absl::InfiniteFuture());
    }
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  // Writes `request` (a BnRequest whose id is `id`) and waits until its
  // response arrives or `deadline`.
  Outcome Call(const grpc::ByteBuffer& request, uint64_t id,
               absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_) {
    PendingCall call;
    absl::MutexLock lock(&mu_);
    if (!Drive(absl::Condition(this, &BnStream::CanWrite), deadline)) {
      return {absl::DeadlineExceededError(
                  "no response before the deadline (waiting to write)"),
              false};
    }
    if (broken_) return BrokenOutcome();
    pending_[id] = &call;
    writing_ = true;
    writer_ = &call;
    write_deadline_ = deadline;
    mu_.Unlock();
    stream_->Write(request, TagOf(Tag::kWrite));  // takes its slices now
    mu_.Lock();
    // Armed after the write: the window update for the last answer then
    // leaves with this request instead of in a packet of its own.
    ArmRead();
    const bool answered =
        Drive(absl::Condition(&call, &PendingCall::Over), deadline) ||
        call.done;
    const bool write_in_flight = writer_ == &call;
    if (write_in_flight) writer_ = nullptr;  // `call` is about to go away
    if (!answered) {
      pending_.erase(id);
      if (write_in_flight) {
        // Flow control has held the write past the deadline: the server is
        // not reading. Cancel now, as the watchdog would on its next look.
        broken_ = true;
        if (!finished_ && cancel_reason_.empty()) {
          cancel_reason_ = "a write was blocked past its deadline";
        }
        mu_.Unlock();
        context_.TryCancel();
        mu_.Lock();
        return {NotWritten(), false};
      }
      return {absl::DeadlineExceededError("no response before the deadline"),
              false};
    }
    if (!call.status.ok() && !call.written && absl::Now() >= deadline) {
      return {NotWritten(), false};  // the watchdog cancelled a stuck write
    }
    return {std::move(call.status), call.retry, std::move(call.response)};
  }

  bool broken() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return broken_;
  }

  // Cancels the stream if a write has been blocked past its caller's deadline
  // (a server that stopped reading: flow control holds the write forever).
  void CancelIfWriteStuck(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (!writing_ || now <= write_deadline_ || finished_) return;
      if (cancel_reason_.empty()) {
        cancel_reason_ = "a write was blocked past its deadline";
      }
    }
    context_.TryCancel();
  }

  // Starts a half-close (WritesDone) unless the stream is broken or a write is
  // in flight; a well-behaved server then ends the stream. Does not wait.
  void HalfClose() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (broken_ || writing_) return;
      broken_ = true;
      writing_ = true;
      write_deadline_ = absl::InfiniteFuture();
      ArmRead();  // to see the server end the stream
    }
    stream_->WritesDone(TagOf(Tag::kWritesDone));
  }

  // Polls (or waits for the thread that does) until the end of the stream has
  // been seen or `deadline`; true if it has.
  bool WaitFinished(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return Drive(absl::Condition(&finished_), deadline);
  }

  // Cancels the call unless it has ended; `why` becomes the error of the
  // calls still waiting. Does not wait.
  void Cancel(absl::string_view why) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      if (cancel_reason_.empty()) cancel_reason_ = std::string(why);
    }
    context_.TryCancel();
  }

 private:
  // The operations started on the call, as completion-queue tags.
  enum class Tag : intptr_t { kStart = 1, kRead, kWrite, kWritesDone, kFinish };

  static void* TagOf(Tag tag) {
    return reinterpret_cast<void*>(static_cast<intptr_t>(tag));
  }

  struct PendingCall {
    bool done = false;        // status, retry and response are final
    bool write_done = false;  // the event of its write has been handled
    bool written = false;     // and the write succeeded
    absl::Status status;
    bool retry = false;
    grpc::ByteBuffer response;

    bool Over() const { return done && write_done; }
  };

  // One completion-queue event, with what the poller took from the stream for
  // it outside mu_.
  struct Event {
    Tag tag = Tag::kStart;
    bool ok = false;
    uint64_t id = 0;             // kRead: the response's id
    grpc::ByteBuffer response;   // kRead
    absl::Status end;            // kFinish
  };

  // The condition of a thread waiting on mu_ in Drive.
  struct UntilOrTokenFree {
    const BnStream* stream;
    const absl::Condition* until;
    bool operator()() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return until->Eval() || !stream->polling_;
    }
  };

  static absl::Status NotWritten() {
    return absl::DeadlineExceededError(
        "the request could not be written before the deadline (the server is "
        "not reading the BN stream)");
  }

  bool CanWrite() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !writing_ || broken_;
  }
  // Nothing started on the call is still in flight (the read ended before
  // Finish was started).
  bool Drained() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return finished_ && !writing_;
  }

  Outcome BrokenOutcome() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return {end_status_, end_retry_};
    return {absl::UnavailableError("the BN stream broke"), true};
  }

  // Returns once `until` holds (true) or `deadline` has passed (false, unless
  // `until` holds by then). Meanwhile polls the queue whenever no other thread
  // does, handling every event taken, and otherwise sleeps until `until`
  // holds or the poller token is free. Releases mu_ while polling.
  bool Drive(const absl::Condition& until, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const UntilOrTokenFree wake{this, &until};
    while (!until.Eval()) {
      if (polling_) {
        if (!mu_.AwaitWithDeadline(absl::Condition(&wake), deadline)) {
          return false;
        }
        continue;
      }
      polling_ = true;
      mu_.Unlock();
      Event event;
      const bool got = Poll(deadline, &event);
      mu_.Lock();
      polling_ = false;
      if (got) {
        Handle(std::move(event));
      } else if (absl::Now() >= deadline) {
        return until.Eval();
      }
    }
    return true;
  }

  // Takes one event from the queue, waiting at most until `deadline` (false
  // if none came), and starts Finish if it is a failed read (Handle arms the
  // read after an answer, if another call waits).
  // REQUIRES: the caller holds the poller token and not mu_.
  bool Poll(absl::Time deadline, Event* event) ABSL_LOCKS_EXCLUDED(mu_) {
    void* tag = nullptr;
    bool ok = false;
    if (cq_.AsyncNext(&tag, &ok, ToGprTime(deadline)) !=
        grpc::CompletionQueue::GOT_EVENT) {
      return false;  // TIMEOUT; SHUTDOWN comes only after the destructor ran
    }
    event->tag = static_cast<Tag>(reinterpret_cast<intptr_t>(tag));
    event->ok = ok;
    if (event->tag == Tag::kRead) {
      if (ok) {
        absl::StatusOr<uint64_t> id = proto::PeekBnId(incoming_);
        if (id.ok()) {
          event->id = *id;
          event->response.Swap(&incoming_);  // Handle re-arms if a call waits
        } else {
          // Not a BnResponse: nothing more on this stream can be trusted.
          // Handled as a failed read; the cancel reason ends the calls.
          Cancel(absl::StrCat("the server sent a malformed BN response (",
                              id.status().message(), ")"));
          event->ok = false;
        }
      }
      if (!event->ok) {
        // Nothing more to receive; the status ends the call.
        stream_->Finish(&finish_status_, TagOf(Tag::kFinish));
      }
    } else if (event->tag == Tag::kFinish) {
      event->end = proto::FromGrpcStatus(finish_status_);
    }
    return true;
  }

  void Handle(Event event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    switch (event.tag) {
      case Tag::kStart:  // not posted while the metadata is corked
        break;
      case Tag::kRead: {
        if (!event.ok) {  // Finish was started: no new writes
          broken_ = true;
          break;
        }
        read_armed_ = false;
        auto it = pending_.find(event.id);
        if (it != pending_.end()) {  // else its caller gave up
          PendingCall* call = it->second;
          pending_.erase(it);
          call->response = std::move(event.response);
          call->done = true;
        }
        // Other calls wait for answers; with none, the next call arms it.
        if (!pending_.empty()) ArmRead();
        break;
      }
      case Tag::kWrite:
        writing_ = false;
        if (writer_ != nullptr) {
          writer_->write_done = true;
          writer_->written = event.ok;
          writer_ = nullptr;
        }
        // A failed write means the call is over: the read fails next, and the
        // end of the stream fails every pending call, the writer's included.
        if (!event.ok) broken_ = true;
        break;
      case Tag::kWritesDone:
        writing_ = false;
        break;
      case Tag::kFinish:
        End(event.end);
        break;
    }
  }

  // Starts a read unless one is in flight or the read side has ended.
  void ArmRead() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (read_armed_) return;
    read_armed_ = true;
    stream_->Read(&incoming_, TagOf(Tag::kRead));
  }

  // Records how the stream ended and fails every call still waiting.
  void End(const absl::Status& end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    broken_ = true;
    if (!cancel_reason_.empty()) {
      end_status_ = absl::UnavailableError(
          absl::StrCat("the BN stream was cancelled: ", cancel_reason_));
      end_retry_ = true;
    } else {
      switch (end.code()) {
        case absl::StatusCode::kOk:
        case absl::StatusCode::kUnavailable:
        case absl::StatusCode::kCancelled:
        case absl::StatusCode::kAborted:
        case absl::StatusCode::kDeadlineExceeded:
        case absl::StatusCode::kInternal:
        case absl::StatusCode::kUnknown:
          // The transport or the server went away: a fresh stream may work.
          end_status_ = absl::UnavailableError(
              absl::StrCat("the BN stream ended: ",
                           end.ok() ? "the server closed it" : end.ToString()));
          end_retry_ = true;
          break;
        default:
          // The server refused the stream itself; a new one fares no better.
          end_status_ = absl::Status(
              end.code(),
              absl::StrCat("the server ended the BN stream: ", end.message()));
          end_retry_ = false;
          break;
      }
    }
    for (auto& [id, call] : pending_) {
      call->status = end_status_;
      call->retry = end_retry_;
      call->done = true;
    }
    pending_.clear();
    finished_ = true;
  }

  // Outlives the call, which posts its events here.
  grpc::CompletionQueue cq_;
  // Declared before stream_, which refers to it and must be destroyed first.
  grpc::ClientContext context_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> stream_;
  // Given to Read by ArmRead (under mu_, only while !read_armed_) and filled
  // by that read; the poller takes it before Handle clears read_armed_.
  grpc::ByteBuffer incoming_;
  // Filled by Finish, which the poller starts; read by the poller.
  grpc::Status finish_status_;

  mutable absl::Mutex mu_;
  bool polling_ ABSL_GUARDED_BY(mu_) = false;   // the poller token is taken
  bool broken_ ABSL_GUARDED_BY(mu_) = false;    // no more writes
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // the end has been handled
  bool writing_ ABSL_GUARDED_BY(mu_) = false;   // a write or WritesDone
  // A read has been started and its event not yet handled (or it failed,
  // which ends the read side for good).
  bool read_armed_ ABSL_GUARDED_BY(mu_) = false;
  // The call whose write is in flight; null for WritesDone or once that
  // caller has returned.
  PendingCall* writer_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Time write_deadline_ ABSL_GUARDED_BY(mu_);
  std::string cancel_reason_ ABSL_GUARDED_BY(mu_);
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
  bool end_retry_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, PendingCall*> pending_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Connect(
    PsClientOptions options) {
  const absl::Time deadline = absl::Now() + options.rpc_timeout;
  if (options.servers.empty()) {
    return absl::InvalidArgumentError("PsClientOptions.servers is empty");
  }
  for (size_t i = 0; i < options.servers.size(); ++i) {
    if (options.servers[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("PsClientOptions.servers[", i, "] is empty"));
    }
  }
  if (options.job.empty()) {
    return absl::InvalidArgumentError("PsClientOptions.job is empty");
  }
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PsClientOptions.num_workers is ", options.num_workers,
                     "; need at least 1"));
  }
  if (options.worker < 0 || options.worker >= options.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PsClientOptions.worker is ", options.worker,
        "; need 0 <= worker < num_workers = ", options.num_workers));
  }
  if (options.rpc_timeout <= absl::ZeroDuration() ||
      options.rpc_timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        "PsClientOptions.rpc_timeout must be finite and positive");
  }
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(
        "PsClientOptions.max_attempts must be at least 1");
  }
  if (options.initial_backoff < absl::ZeroDuration() ||
      options.initial_backoff == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        "PsClientOptions.initial_backoff must be finite and non-negative");
  }
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.heartbeat_interval == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        "PsClientOptions.heartbeat_interval must be finite and positive");
  }
  if (!options.token.empty()) {
    if (absl::Status s = proto::ValidateToken(options.token); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("PsClientOptions.token: ", s.message()));
    }
  }
  if (options.credentials == nullptr) {
    options.credentials = grpc::InsecureChannelCredentials();
  }

  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(proto::kMaxMessageBytes);
  args.SetMaxReceiveMessageSize(proto::kMaxMessageBytes);
  const int reconnect_ms = static_cast<int>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(options.initial_backoff),
                          20, kMaxReconnectBackoffMs));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, reconnect_ms);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
  std::vector<Shard> shards(options.servers.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    shards[i].address = options.servers[i];
    shards[i].channel = grpc::CreateCustomChannel(options.servers[i],
                                                  options.credentials, args);
    shards[i].stub = proto::ParameterServer::NewStub(shards[i].channel);
    shards[i].push_method = std::make_unique<grpc::internal::RpcMethod>(
        kPushMethod, grpc::internal::RpcMethod::CLIENT_STREAMING,
        shards[i].channel);
    shards[i].pull_method = std::make_unique<grpc::internal::RpcMethod>(
        kPullMethod, grpc::internal::RpcMethod::SERVER_STREAMING,
        shards[i].channel);
  }

  std::unique_ptr<PsClient> client =
      absl::WrapUnique(new PsClient(std::move(options), std::move(shards)));
  if (absl::Status s = client->RegisterAll(deadline); !s.ok()) return s;
  client->background_ = std::thread(&PsClient::BackgroundLoop, client.get());
  return client;
}

PsClient::PsClient(PsClientOptions options, std::vector<Shard> shards)
    : options_(std::move(options)),
      shards_(std::move(shards)),
      streams_(shards_.size()) {}

PsClient::~PsClient() {
  {
    absl::MutexLock lock(&bg_mu_);
    stopping_ = true;
    if (heartbeat_context_ != nullptr) heartbeat_context_->TryCancel();
  }
  if (background_.joinable()) background_.join();

  std::vector<std::shared_ptr<BnStream>> streams;
  {
    absl::MutexLock lock(&streams_mu_);
    streams.swap(streams_);
  }
  for (const auto& stream : streams) {
    if (stream != nullptr) stream->HalfClose();
  }
  const absl::Time deadline =
      absl::Now() + std::min(options_.rpc_timeout, kCloseGrace);
  for (const auto& stream : streams) {
    if (stream != nullptr) stream->WaitFinished(deadline);
  }
  for (const auto& stream : streams) {
    if (stream != nullptr) stream->Cancel("the client was destroyed");
  }
  streams.clear();  // each drains its call, which ends promptly once cancelled
}

std::string PsClient::ShardName(int shard) const {
  return absl::StrCat("shard ", shard, " (", shards_[shard].address, ")");
}

absl::Duration PsClient::Backoff(int retry) {
  absl::Duration d = options_.initial_backoff;
  for (int i = 0; i < retry && d < kMaxBackoff; ++i) d *= 2;
  d = std::min(d, kMaxBackoff);
  absl::MutexLock lock(&rng_mu_);
  return d * absl::Uniform(rng_, 0.8, 1.2);
}

absl::Duration PsClient::CallTimeout() const {
  // Calls may wait on the servers' barriers; let the server's error, which
  // names the workers it waited for, arrive before the client gives up.
  // 0 (proto3's unset) means the server did not say.
  if (config_.barrier_timeout_ms() <= 0) return options_.rpc_timeout;
  return std::max(options_.rpc_timeout,
                  absl::Milliseconds(config_.barrier_timeout_ms()) +
                      absl::Seconds(5));
}

template <typename Attempt>
absl::Status PsClient::WithRetries(Attempt attempt) {
  absl::Status status;
  for (int i = 0; i < options_.max_attempts; ++i) {
    if (i > 0) absl::SleepFor(Backoff(i - 1));
    status = attempt(absl::Now() + CallTimeout());
    if (status.ok() || !IsRetryable(status.code())) return status;
  }
  if (options_.max_attempts > 1) {
    status = absl::Status(status.code(),
                          absl::StrCat(status.message(), " (after ",
                                       options_.max_attempts, " attempts)"));
  }
  return status;
}

absl::Status PsClient::RegisterAll(absl::Time deadline) {
  std::vector<proto::RegisterResponse> responses(shards_.size());
  proto::RegisterRequest request;
  request.set_job(options_.job);
  request.set_worker(options_.worker);
  request.set_num_workers(options_.num_workers);
  request.set_num_shards(num_shards());
  for (int i = 0; i < num_shards(); ++i) {
    absl::Status status;
    int attempts = 0;
    while (true) {
      ++attempts;
      grpc::ClientContext context;
      SetUp(&context, options_.token, deadline);
      status = proto::FromGrpcStatus(
          shards_[i].stub->Register(&context, request, &responses[i]));
      // UNAVAILABLE: the server may still be starting.
      if (status.code() != absl::StatusCode::kUnavailable) break;
      const absl::Duration wait = Backoff(attempts - 1);
      if (absl::Now() + wait >= deadline) break;
      absl::SleepFor(wait);
    }
    if (!status.ok()) {
      return Annotate(
          status,
          absl::StrCat("Register with ", ShardName(i), " (", attempts,
                       " attempts in ",
                       absl::FormatDuration(options_.rpc_timeout), ")"));
    }
  }
  return CheckConfigs(responses);
}

absl::Status PsClient::CheckConfigs(
    const std::vector<proto::RegisterResponse>& responses) {
  for (int i = 0; i < num_shards(); ++i) {
    const proto::JobConfig& c = responses[i].config();
    const std::string who = ShardName(i);
    if (c.job() != options_.job) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, " runs job '", c.job(), "', not '", options_.job, "'"));
    }
    if (c.num_workers() != options_.num_workers) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, " runs a job of ", c.num_workers(),
          " workers; this worker was told ", options_.num_workers));
    }
    if (c.num_shards() != num_shards()) {
      return absl::FailedPreconditionError(
          absl::StrCat(who, " runs a job of ", c.num_shards(),
                       " shards; this worker was given ", num_shards(),
                       " server addresses"));
    }
    if (c.shard() != i) {
      return absl::FailedPreconditionError(
          absl::StrCat(who, " is shard ", c.shard(),
                       " of the job; list the servers in "
                       "shard order"));
    }
    if (c.policy() == proto::POLICY_UNSPECIFIED) {
      return absl::FailedPreconditionError(
          absl::StrCat(who, " reports no BN policy"));
    }
    if (i > 0) {
      proto::JobConfig a = responses[0].config();
      proto::JobConfig b = c;
      a.clear_shard();
      b.clear_shard();
      std::string report;
      google::protobuf::util::MessageDifferencer differencer;
      differencer.ReportDifferencesToString(&report);
      if (!differencer.Compare(a, b)) {
        return absl::FailedPreconditionError(absl::StrCat(
            who, " runs the job with a different config than shard 0: ",
            absl::StripTrailingAsciiWhitespace(report)));
      }
    }
  }
  config_ = responses[0].config();
  if (config_.heartbeat_timeout_ms() > 0 &&
      options_.heartbeat_interval >=
          absl::Milliseconds(config_.heartbeat_timeout_ms())) {
    return absl::FailedPreconditionError(
        absl::StrCat("heartbeat_interval ",
                     absl::FormatDuration(options_.heartbeat_interval),
                     " is not shorter than the servers' heartbeat timeout of ",
                     config_.heartbeat_timeout_ms(), " ms"));
  }
  return absl::OkStatus();
}

absl::Status PsClient::InitParameters(
    const std::map<std::string, Param>& params) {
  std::vector<std::vector<const std::string*>> by_shard(num_shards());
  for (const auto& [key, p] : params) {
    if (absl::Status s = CheckParam(key, p); !s.ok()) return s;
    if (p.values.size() * sizeof(float) + TensorOverhead(key, p) >
        kInitMessageBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key '", key, "': ", p.values.size(),
          " floats do not fit one InitParameters message (at most ",
          proto::kMaxMessageBytes, " bytes)"));
    }
    by_shard[proto::ShardForKey(key, num_shards())].push_back(&key);
  }
  const std::vector<int> shards = ShardsWithKeys(by_shard);
  return RunParallel(static_cast<int>(shards.size()), [&](int j) {
    const int shard = shards[j];
    return Annotate(InitShard(shard, by_shard[shard], params),
                    absl::StrCat("InitParameters on ", ShardName(shard)));
  });
}

absl::Status PsClient::InitShard(int shard,
                                 const std::vector<const std::string*>& keys,
                                 const std::map<std::string, Param>& params) {
  proto::InitParametersRequest request;
  request.set_job(options_.job);
  request.set_worker(options_.worker);
  size_t bytes = 0;
  auto send = [&]() {
    return WithRetries([&](absl::Time deadline) {
      grpc::ClientContext context;
      SetUp(&context, options_.token, deadline);
      proto::InitParametersResponse response;
      return proto::FromGrpcStatus(
          shards_[shard].stub->InitParameters(&context, request, &response));
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

absl::Status PsClient::PushGradients(
    int64_t step, int64_t num_samples,
    const std::map<std::string, Param>& grads) {
  return PushAll(step, num_samples, grads, nullptr);
}

absl::Status PsClient::PushGradients(
    int64_t step, int64_t num_samples,
    std::shared_ptr<const std::map<std::string, Param>> grads) {
  if (grads == nullptr) {
    return absl::InvalidArgumentError("PushGradients: null gradients");
  }
  const std::map<std::string, Param>& g = *grads;
  return PushAll(step, num_samples, g, std::move(grads));
}

absl::Status PsClient::PushAll(int64_t step, int64_t num_samples,
                               const std::map<std::string, Param>& grads,
                               const std::shared_ptr<const void>& owner) {
  if (step < 0 || num_samples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PushGradients: step ", step, " and num_samples ",
                     num_samples, " must not be negative"));
  }
  std::vector<std::vector<const std::string*>> by_shard(num_shards());
  for (const auto& [key, p] : grads) {
    if (absl::Status s = CheckParam(key, p); !s.ok()) return s;
    by_shard[proto::ShardForKey(key, num_shards())].push_back(&key);
  }
  const std::vector<int> shards = ShardsWithKeys(by_shard);
  return RunParallel(static_cast<int>(shards.size()), [&](int j) {
    const int shard = shards[j];
    absl::Status s = WithRetries([&](absl::Time deadline) {
      return PushShard(shard, step, num_samples, by_shard[shard], grads, owner,
                       deadline);
    });
    return Annotate(s, absl::StrCat("PushGradients of step ", step, " to ",
                                    ShardName(shard)));
  });
}

absl::Status PsClient::PushShard(int shard, int64_t step, int64_t num_samples,
                                 const std::vector<const std::string*>& keys,
                                 const std::map<std::string, Param>& grads,
                                 const std::shared_ptr<const void>& owner,
                                 absl::Time deadline) {
  grpc::ClientContext context;
  SetUp(&context, options_.token, deadline);
  grpc::ByteBuffer response_bytes;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
          shards_[shard].channel.get(), *shards_[shard].push_method, &context,
          &response_bytes));

  proto::PushGradientsRequest head;
  head.set_job(options_.job);
  head.set_worker(options_.worker);
  head.set_step(step);
  head.set_num_samples(num_samples);
  // Each message is written as soon as it is full, so that no more than one
  // is ever held.
  proto::ChunkedMessageBuilder message(
      head, proto::PushGradientsRequest::kChunksFieldNumber,
      proto::kBulkMessageBytes);
  const auto write = [&writer](grpc::ByteBuffer m) { return writer->Write(m); };
  bool ok = true;
  for (const std::string* key : keys) {
    const Param& p = grads.at(*key);
    ok = message.AddTensor(*key, p.shape, p.values, owner, write);
    if (!ok) break;
  }
  if (ok && message.num_chunks() > 0) ok = writer->Write(message.Build());
  // After a failed write the server has ended the call; Finish says why.
  if (ok) writer->WritesDone();
  return proto::FromGrpcStatus(writer->Finish());
}

absl::StatusOr<std::map<std::string, Param>> PsClient::PullParameters(
    int64_t min_version) {
  std::map<std::string, Param> out;
  if (absl::Status s = PullParametersInto(min_version, &out); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::map<std::string, Param>> PsClient::PullParameters(
    const std::vector<std::string>& keys, int64_t min_version) {
  std::map<std::string, Param> out;
  for (const std::string& key : keys) out[key];
  if (out.empty()) return out;
  if (absl::Status s = PullParametersInto(min_version, &out); !s.ok()) return s;
  return out;
}

absl::Status PsClient::PullParametersInto(int64_t min_version,
                                          std::map<std::string, Param>* params) {
  if (min_version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PullParameters: negative min_version ", min_version));
  }
  std::vector<int> shards;
  if (params->empty()) {
    // Every key: each shard's tensors go to a map of its own, merged after.
    std::vector<std::map<std::string, Param>> got(num_shards());
    for (int i = 0; i < num_shards(); ++i) shards.push_back(i);
    absl::Status s = PullFrom(
        std::vector<std::vector<std::string>>(num_shards()), shards,
        min_version, [&got](int shard, const std::string& key) {
          return &got[shard][key];
        });
    if (!s.ok()) return s;
    for (auto& m : got) params->merge(m);  // keys are disjoint
    return absl::OkStatus();
  }
  std::vector<std::vector<std::string>> by_shard(num_shards());
  for (const auto& [key, _] : *params) {
    if (absl::Status s = CheckKey(key, "key"); !s.ok()) return s;
    by_shard[proto::ShardForKey(key, num_shards())].push_back(key);
  }
  shards = ShardsWithKeys(by_shard);
  // Only finds: safe from one thread per shard.
  return PullFrom(by_shard, shards, min_version,
                  [params](int, const std::string& key) -> Param* {
                    auto it = params->find(key);
                    return it == params->end() ? nullptr : &it->second;
                  });
}

absl::Status PsClient::PullFrom(
    const std::vector<std::vector<std::string>>& keys_by_shard,
    const std::vector<int>& shards, int64_t min_version, const PullSlot& slot) {
  return RunParallel(static_cast<int>(shards.size()), [&](int j) {
    const int shard = shards[j];
    absl::Status s = WithRetries([&](absl::Time deadline) {
      return PullShard(shard, keys_by_shard[shard], min_version, slot,
                       deadline);
    });
    return Annotate(s, absl::StrCat("PullParameters from ", ShardName(shard)));
  });
}

absl::Status PsClient::PullShard(int shard,
                                 const std::vector<std::string>& keys,
                                 int64_t min_version, const PullSlot& slot,
                                 absl::Time deadline) {
  grpc::ClientContext context;
  SetUp(&context, options_.token, deadline);
  proto::PullParametersRequest request;
  request.set_job(options_.job);
  request.set_worker(options_.worker);
  for (const std::string& key : keys) request.add_keys(key);
  request.set_min_version(min_version);
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
          shards_[shard].channel.get(), *shards_[shard].pull_method, &context,
          request_bytes));

  std::set<std::string> received;
  proto::TensorReader tensors(
      [&](const std::string& key, absl::Span<const int64_t> shape,
          int64_t n) -> absl::StatusOr<float*> {
        const int owner = proto::ShardForKey(key, num_shards());
        if (owner != shard) {
          return absl::InvalidArgumentError(
              absl::StrCat("key '", key, "' belongs to shard ", owner));
        }
        if (!received.insert(key).second) {
          return absl::InvalidArgumentError(
              absl::StrCat("key '", key, "' was sent twice"));
        }
        Param* p = slot(shard, key);
        if (p == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("key '", key, "' was not requested"));
        }
        p->shape.assign(shape.begin(), shape.end());
        p->values.resize(n);
        return p->values.data();
      },
      [](const std::string&) { return absl::OkStatus(); });
  grpc::ByteBuffer message;
  proto::PullParametersResponse head;
  absl::Status bad;
  while (bad.ok() && reader->Read(&message)) {
    bad = tensors.Read(message, proto::PullParametersResponse::kChunksFieldNumber,
                       &head);
  }
  if (!bad.ok()) {
    context.TryCancel();
    while (reader->Read(&message)) {
    }
    reader->Finish();
    return Malformed(ShardName(shard), bad);
  }
  if (absl::Status s = proto::FromGrpcStatus(reader->Finish()); !s.ok()) {
    return s;
  }
  if (tensors.pending()) {
    return Malformed(ShardName(shard),
                     absl::InvalidArgumentError(
                         "the stream ended in the middle of a tensor"));
  }
  for (const std::string& key : keys) {
    if (received.count(key) == 0) {
      return absl::NotFoundError(absl::StrCat("key '", key, "' was not sent"));
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<PsClient::BnStream> PsClient::GetStream(int shard) {
  std::shared_ptr<BnStream> old;  // destroyed (drained) after unlocking
  absl::MutexLock lock(&streams_mu_);
  std::shared_ptr<BnStream>& slot = streams_[shard];
  if (slot == nullptr || slot->broken()) {
    old = std::move(slot);
    slot = std::make_shared<BnStream>(shards_[shard].channel,
                                     options_.token);
  }
  return slot;
}

absl::StatusOr<PsClient::BnAnswer> PsClient::BnCall(
    proto::BnRequest head, const proto::BnStatsOut& stats) {
  if (absl::Status s = CheckKey(head.layer(), "BN layer"); !s.ok()) return s;
  head.set_job(options_.job);
  head.set_worker(options_.worker);
  head.clear_id();  // each attempt puts its own in front
  const grpc::Slice body = proto::FrameBn(head, proto::kBnRequestStats, stats);
  const size_t bytes = body.size() + proto::kMaxBnIdBytes;
  if (bytes > static_cast<size_t>(proto::kMaxMessageBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("BN request for layer '", head.layer(), "' has ", bytes,
                     " bytes, more than ", proto::kMaxMessageBytes));
  }
  const int shard = proto::ShardForKey(head.layer(), num_shards());
  // Only a failed call names itself: not formatted on every call.
  auto context = [&] {
    return absl::StrCat(proto::BnPhase_Name(head.phase()), " of layer '",
                        head.layer(), "' at step ", head.step(), " on ",
                        ShardName(shard));
  };
  const absl::Time deadline = absl::Now() + CallTimeout();
  for (int attempt = 0;; ++attempt) {
    std::shared_ptr<BnStream> stream = GetStream(shard);
    const uint64_t id = next_bn_id_.fetch_add(1, std::memory_order_relaxed);
    const grpc::Slice message[] = {proto::FrameBnId(id), body};
    BnStream::Outcome out =
        stream->Call(grpc::ByteBuffer(message, 2), id, deadline);
    if (!out.status.ok()) {
      if (out.retry && attempt == 0) {
        const absl::Duration wait =
            std::min(options_.initial_backoff, deadline - absl::Now());
        if (wait >= absl::ZeroDuration()) {
          absl::SleepFor(wait);
          continue;
        }
      }
      return Annotate(out.status, context());
    }
    BnAnswer answer;
    if (absl::Status s = proto::ParseBn(out.response, proto::kBnResponseStats,
                                        &answer.head, &answer.stats);
        !s.ok()) {
      // context() names the shard already.
      return Annotate(absl::InvalidArgumentError(
                          absl::StrCat("malformed response: ", s.message())),
                      context());
    }
    const int code = answer.head.code();
    if (code == 0) return answer;
    if (code < 0 ||
        code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
      return absl::UnknownError(absl::StrCat(context(), ": code ", code, ": ",
                                             answer.head.message()));
    }
    return absl::Status(static_cast<absl::StatusCode>(code),
                        absl::StrCat(context(), ": ", answer.head.message()));
  }
}

absl::Status PsClient::MalformedBn(const std::string& layer,
                                 const absl::Status& s) const {
  return Malformed(ShardName(proto::ShardForKey(layer, num_shards())), s);
}

absl::StatusOr<BnForwardResult> PsClient::BnForward(const std::string& layer,
                                                    int64_t step,
                                                    const bn::Moments& local,
                                                    bool want_running) {
  if (absl::Status s = bn::ValidateMoments(local); !s.ok()) return s;
  proto::BnRequest head = BnHead(layer, proto::BN_FORWARD, step);
  head.set_want_running(want_running);
  proto::BnStatsOut stats;
  stats.moments = &local;
  absl::StatusOr<BnAnswer> answer = BnCall(std::move(head), stats);
  if (!answer.ok()) return answer.status();
  BnForwardResult result;
  absl::StatusOr<bn::Moments> merged =
      proto::DecodeMoments(std::move(answer->stats.moments), local.channels());
  if (!merged.ok()) return MalformedBn(layer, merged.status());
  result.merged = *std::move(merged);
  if (want_running) {
    absl::StatusOr<bn::RunningStats> running = proto::DecodeRunning(
        std::move(answer->stats.running), local.channels());
    if (!running.ok()) return MalformedBn(layer, running.status());
    result.running = *std::move(running);
  }
  result.contributors = answer->head.contributors();
  return result;
}

absl::StatusOr<bn::BackwardSums> PsClient::BnBackward(
    const std::string& layer, int64_t step, const bn::BackwardSums& local) {
  if (absl::Status s = CheckSums(local); !s.ok()) return s;
  proto::BnStatsOut stats;
  stats.sums = &local;
  absl::StatusOr<BnAnswer> answer =
      BnCall(BnHead(layer, proto::BN_BACKWARD, step), stats);
  if (!answer.ok()) return answer.status();
  absl::StatusOr<bn::BackwardSums> sums =
      proto::DecodeSums(std::move(answer->stats.sums), local.sum_dy.size());
  if (!sums.ok()) return MalformedBn(layer, sums.status());
  return sums;
}

absl::Status PsClient::BnRecal(const std::string& layer, int64_t batch,
                               const bn::Moments& moments) {
  if (absl::Status s = bn::ValidateMoments(moments); !s.ok()) return s;
  proto::BnStatsOut stats;
  stats.moments = &moments;
  return BnCall(BnHead(layer, proto::BN_RECAL, batch), stats).status();
}

absl::StatusOr<bn::RunningStats> PsClient::BnRecalFinish(
    const std::string& layer) {
  return BnCallForRunning(BnHead(layer, proto::BN_RECAL_FINISH), {}, -1);
}

absl::StatusOr<bn::RunningStats> PsClient::BnLocalRunning(
    const std::string& layer, const bn::RunningStats& running) {
  if (absl::Status s = CheckRunning(running); !s.ok()) return s;
  proto::BnStatsOut stats;
  stats.running = &running;
  return BnCallForRunning(BnHead(layer, proto::BN_LOCAL_RUNNING), stats,
                          running.mean.size());
}

absl::StatusOr<bn::RunningStats> PsClient::BnRunning(const std::string& layer,
                                                     int64_t channels) {
  if (channels <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BnRunning: ", channels, " channels"));
  }
  return BnCallForRunning(BnHead(layer, proto::BN_RUNNING), {}, channels);
}

absl::StatusOr<bn::RunningStats> PsClient::BnCallForRunning(
    proto::BnRequest head, const proto::BnStatsOut& stats, int64_t channels) {
  const std::string layer = head.layer();
  absl::StatusOr<BnAnswer> answer = BnCall(std::move(head), stats);
  if (!answer.ok()) return answer.status();
  absl::StatusOr<bn::RunningStats> running =
      proto::DecodeRunning(std::move(answer->stats.running), channels);
  if (!running.ok()) return MalformedBn(layer, running.status());
  return running;
}

absl::StatusOr<int64_t> PsClient::StartStep(int64_t step) {
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("StartStep: negative step ", step));
  }
  proto::StartStepRequest request;
  request.set_job(options_.job);
  request.set_worker(options_.worker);
  request.set_step(step);
  proto::StartStepResponse response;
  absl::Status s = WithRetries([&](absl::Time deadline) {
    grpc::ClientContext context;
    SetUp(&context, options_.token, deadline);
    return proto::FromGrpcStatus(
        shards_[0].stub->StartStep(&context, request, &response));
  });
  if (!s.ok()) {
    return Annotate(s, absl::StrCat("StartStep ", step, " on ", ShardName(0)));
  }
  return response.min_clock();
}

absl::Status PsClient::FinishStep(int64_t completed) {
  if (completed < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("FinishStep: negative clock ", completed));
  }
  proto::FinishStepRequest request;
  request.set_job(options_.job);
  request.set_worker(options_.worker);
  request.set_completed(completed);
  absl::Status s = WithRetries([&](absl::Time deadline) {
    grpc::ClientContext context;
    SetUp(&context, options_.token, deadline);
    proto::FinishStepResponse response;
    return proto::FromGrpcStatus(
        shards_[0].stub->FinishStep(&context, request, &response));
  });
  return Annotate(s,
                  absl::StrCat("FinishStep ", completed, " on ", ShardName(0)));
}

absl::StatusOr<proto::StatusResponse> PsClient::GetStatus(int shard) {
  if (shard < 0 || shard >= num_shards()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GetStatus: shard ", shard, " is not in [0, ", num_shards(), ")"));
  }
  proto::StatusResponse response;
  absl::Status s = WithRetries([&](absl::Time deadline) {
    grpc::ClientContext context;
    SetUp(&context, options_.token, deadline);
    return proto::FromGrpcStatus(shards_[shard].stub->GetStatus(
        &context, proto::StatusRequest(), &response));
  });
  if (!s.ok())
    return Annotate(s, absl::StrCat("GetStatus of ", ShardName(shard)));
  return response;
}

HeartbeatStats PsClient::heartbeat_stats() const {
  absl::MutexLock lock(&bg_mu_);
  return heartbeat_stats_;
}

void PsClient::BackgroundLoop() {
  absl::Time next_heartbeat = absl::Now() + options_.heartbeat_interval;
  while (true) {
    {
      absl::MutexLock lock(&bg_mu_);
      bg_mu_.AwaitWithDeadline(
          absl::Condition(&stopping_),
          std::min(next_heartbeat, absl::Now() + kWatchdogTick));
      if (stopping_) return;
    }
    std::vector<std::shared_ptr<BnStream>> streams;
    {
      absl::MutexLock lock(&streams_mu_);
      streams = streams_;
    }
    const absl::Time now = absl::Now();
    for (const auto& stream : streams) {
      if (stream != nullptr) stream->CancelIfWriteStuck(now);
    }
    streams.clear();
    if (now >= next_heartbeat) {
      SendHeartbeats();
      next_heartbeat += options_.heartbeat_interval;
      if (next_heartbeat < absl::Now()) {
        next_heartbeat = absl::Now() + options_.heartbeat_interval;
      }
    }
  }
}

void PsClient::SendHeartbeats() {
  // Short deadlines: a dead shard must not delay the others' heartbeats much.
  const absl::Duration timeout =
      std::min(options_.rpc_timeout,
               std::max(options_.heartbeat_interval, absl::Seconds(1)));
  proto::HeartbeatRequest request;
  request.set_job(options_.job);
  request.set_worker(options_.worker);
  for (int i = 0; i < num_shards(); ++i) {
    grpc::ClientContext context;
    SetUp(&context, options_.token, absl::Now() + timeout);
    {
      absl::MutexLock lock(&bg_mu_);
      if (stopping_) return;
      heartbeat_context_ = &context;
    }
    proto::HeartbeatResponse response;
    const absl::Status s = proto::FromGrpcStatus(
        shards_[i].stub->Heartbeat(&context, request, &response));
    absl::MutexLock lock(&bg_mu_);
    heartbeat_context_ = nullptr;
    ++heartbeat_stats_.sent;
    if (!s.ok()) {
      ++heartbeat_stats_.failed;
      heartbeat_stats_.last_error =
          Annotate(s, absl::StrCat("Heartbeat to ", ShardName(i)));
    } else if (i == 0) {
      heartbeat_stats_.live_workers.assign(response.live_workers().begin(),
                                           response.live_workers().end());
    }
  }
}

}  // namespace bnps::worker
