#include "client/internal/bn_stream.h"

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/internal/bn_socket.h"
#include "grpc/support/time.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/async_stream.h"
#include "proto/codec.h"
#include "proto/generation.h"
#include "proto/limits.h"
#include "proto/sharding.h"
#include "security/job_token.h"
#include "util/log_escape.h"

namespace bnps::client::internal {
namespace {

constexpr char kBnMethod[] = "/bnps.proto.ParameterServer/BnSync";
// The destructor waits at most this long for servers to end the BN streams.
constexpr absl::Duration kCloseGrace = absl::Seconds(1);

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
// waking any other thread. With a spin (GrpcClientOptions::bn_spin) the poller
// first polls without blocking until the spin ends, then blocks: an answer
// that comes within the spin is taken without the thread having slept.
//
// Callers write one at a time (`writing_`; gRPC allows one write and one read
// in flight). Once the stream has ended, or a write failed, it is `broken` and
// BnCalls opens a new one for later calls. An answer whose caller gave up at
// its deadline is dropped.
class BnStream {
 public:
  struct Outcome {
    absl::Status status;
    // The stream broke under the call: repeating it on a fresh stream is safe.
    bool retry = false;
    proto::BnResponse response;  // parsed by protobuf's generated class
  };

  BnStream(const std::shared_ptr<grpc::Channel>& channel,
           const std::string& token, int64_t generation, absl::Duration spin)
      : generation_(generation), spin_(spin) {
    context_.AddMetadata(proto::kGenerationMetadataKey,
                         absl::StrCat(generation));
    if (!token.empty()) {
      context_.AddMetadata(std::string(security::kTokenMetadataKey), token);
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

  // Writes `request` (a serialized BnRequest whose id is `id`) and waits until its
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

  int64_t generation() const { return generation_; }

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
    proto::BnResponse response;

    bool Over() const { return done && write_done; }
  };

  // One completion-queue event, with what the poller took from the stream for
  // it outside mu_.
  struct Event {
    Tag tag = Tag::kStart;
    bool ok = false;
    uint64_t id = 0;             // kRead: the response's id
    proto::BnResponse response;  // kRead: parsed by protobuf
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
      bool got = false;
      if (spin_ > absl::ZeroDuration()) {
        // Non-blocking polls (each still reads the socket) until the spin
        // ends, then a blocking one.
        const absl::Time spin_end = std::min(absl::Now() + spin_, deadline);
        do {
          got = Poll(absl::InfinitePast(), &event);
        } while (!got && absl::Now() < spin_end);
      }
      if (!got) got = Poll(deadline, &event);
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
        // The whole response is parsed here (off mu_) to learn its id; the
        // parse empties incoming_ for the next read (Handle re-arms it if a
        // call waits).
        const grpc::Status parsed =
            grpc::SerializationTraits<proto::BnResponse>::Deserialize(
                &incoming_, &event->response);
        if (parsed.ok()) {
          event->id = event->response.id();
        } else {
          // Not a BnResponse: nothing more on this stream can be trusted.
          // Handled as a failed read; the cancel reason ends the calls.
          Cancel(
              "the server sent a malformed BN response (protobuf could not "
              "parse it as a BnResponse)");
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

  const int64_t generation_;  // sent when the stream was opened
  const absl::Duration spin_;  // GrpcClientOptions::bn_spin
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

std::shared_ptr<BnStream> BnCalls::GetStream(int shard) {
  std::shared_ptr<BnStream> old;  // destroyed (drained) after unlocking
  absl::MutexLock lock(&streams_mu_);
  if (closed_) return nullptr;
  std::shared_ptr<BnStream>& slot = streams_[shard];
  // A stream opened in an earlier generation is refused by the server.
  if (slot == nullptr || slot->broken() ||
      slot->generation() != channels_->generation()) {
    old = std::move(slot);
    slot = std::make_shared<BnStream>(channels_->shard(shard).channel,
                                     channels_->options().token,
                                     channels_->generation(),
                                     channels_->options().bn_spin);
  }
  return slot;
}

absl::StatusOr<proto::BnResponse> BnCalls::BnCall(proto::BnRequest request) {
  if (absl::Status s = CheckKey(request.layer(), "BN layer"); !s.ok()) {
    return s;
  }
  request.set_job(channels_->options().job);
  request.set_worker(channels_->options().worker);
  request.clear_id();  // each attempt sets its own
  // The id, set per attempt, adds at most a 1-byte tag and a 10-byte varint.
  constexpr size_t kMaxIdBytes = 11;
  const size_t bytes = request.ByteSizeLong() + kMaxIdBytes;
  if (bytes > static_cast<size_t>(proto::kMaxMessageBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("BN request for layer '", request.layer(), "' has ",
                     bytes, " bytes, more than ", proto::kMaxMessageBytes));
  }
  const int shard =
      proto::ShardForKey(request.layer(), channels_->num_shards());
  // Only a failed call names itself: not formatted on every call.
  auto context = [&] {
    return absl::StrCat(proto::BnPhase_Name(request.phase()), " of layer '",
                        request.layer(), "' at step ", request.step(), " on ",
                        channels_->ShardName(shard));
  };
  const absl::Time deadline = absl::Now() + channels_->CallTimeout();
  for (int attempt = 0;; ++attempt) {
    // The first attempt over TCP where the shard offers it; a repeat on
    // the stream.
    std::shared_ptr<BnSocket> socket = attempt == 0 ? GetSocket(shard) : nullptr;
    std::shared_ptr<BnStream> stream;
    if (socket == nullptr) {
      stream = GetStream(shard);
      if (stream == nullptr) {
        return absl::UnavailableError(
            absl::StrCat(context(), ": the client is closed"));
      }
    }
    const uint64_t id = next_bn_id_.fetch_add(1, std::memory_order_relaxed);
    request.set_id(id);
    BnStream::Outcome out;
    if (socket != nullptr) {
      BnSocket::Outcome o = socket->Call(request, deadline);
      out.status = std::move(o.status);
      out.retry = o.retry;
      out.response = std::move(o.response);
    } else {
      grpc::ByteBuffer message;
      bool own_buffer;
      if (grpc::Status s =
              grpc::SerializationTraits<proto::BnRequest>::Serialize(
                  request, &message, &own_buffer);
          !s.ok()) {
        return Annotate(proto::FromGrpcStatus(s), context());
      }
      out = stream->Call(message, id, deadline);
    }
    if (!out.status.ok()) {
      if (out.retry && attempt == 0) {
        const absl::Duration wait =
            std::min(channels_->options().initial_backoff, deadline - absl::Now());
        if (wait >= absl::ZeroDuration()) {
          if (channels_->options().on_retry) {
            channels_->options().on_retry(out.status.code());
          }
          absl::SleepFor(wait);
          continue;
        }
      }
      return Annotate(out.status, context());
    }
    proto::BnResponse& answer = out.response;
    const int code = answer.code();
    if (code == 0) return std::move(answer);
    if (code < 0 ||
        code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
      return absl::UnknownError(absl::StrCat(context(), ": code ", code, ": ",
                                             answer.message()));
    }
    return absl::Status(static_cast<absl::StatusCode>(code),
                        absl::StrCat(context(), ": ", answer.message()));
  }
}

BnCalls::BnCalls(Channels* channels)
    : channels_(channels),
      streams_(channels->num_shards()),
      sockets_(channels->num_shards()),
      socket_state_(channels->num_shards()) {}

std::shared_ptr<BnSocket> BnCalls::GetSocket(int shard) {
  const GrpcClientOptions& options = channels_->options();
  const int port = channels_->bn_port(shard);
  if (!options.bn_over_tcp || port <= 0) return nullptr;
  const int64_t generation = channels_->generation();
  std::shared_ptr<BnSocket> old;  // closed after unlocking
  {
    absl::MutexLock lock(&streams_mu_);
    if (closed_) return nullptr;
    std::shared_ptr<BnSocket>& slot = sockets_[shard];
    // A connection of an earlier generation is refused by the server.
    if (slot != nullptr && !slot->broken() &&
        slot->generation() == generation) {
      return slot;
    }
    SocketState& state = socket_state_[shard];
    if (state.connecting || absl::Now() < state.retry_at) return nullptr;
    state.connecting = true;
    old = std::move(slot);
  }
  old.reset();
  proto::BnHello hello;
  hello.set_job(options.job);
  hello.set_worker(options.worker);
  hello.set_generation(generation);
  hello.set_token(options.token);
  absl::StatusOr<std::unique_ptr<BnSocket>> opened = BnSocket::Connect(
      channels_->Host(shard), port, hello,
      absl::Now() + std::min(options.rpc_timeout, absl::Seconds(5)),
      options.bn_spin);
  absl::MutexLock lock(&streams_mu_);
  SocketState& state = socket_state_[shard];
  state.connecting = false;
  if (!opened.ok()) {
    state.retry_at = absl::Now() + kBnSocketRetry;
    const std::string why(opened.status().message());
    if (why != state.said) {
      state.said = why;
      std::fprintf(stderr,
                   "bnps worker %d: BN over TCP to %s: %s; its BN traffic "
                   "takes the gRPC stream\n",
                   options.worker, channels_->ShardName(shard).c_str(),
                   util::EscapeForLog(why).c_str());  // the server's words
    }
    return nullptr;
  }
  if (closed_) return nullptr;
  if (state.said != "connected") {
    state.said = "connected";
    std::fprintf(stderr, "bnps worker %d: BN over TCP to %s, port %d\n",
                 options.worker, channels_->ShardName(shard).c_str(), port);
  }
  std::shared_ptr<BnSocket>& slot = sockets_[shard];
  slot = std::shared_ptr<BnSocket>(*std::move(opened));
  return slot;
}

BnCalls::~BnCalls() { Close(); }

void BnCalls::Close() {
  std::vector<std::shared_ptr<BnStream>> streams;
  std::vector<std::shared_ptr<BnSocket>> sockets;
  {
    absl::MutexLock lock(&streams_mu_);
    streams.swap(streams_);
    sockets.swap(sockets_);
    closed_ = true;
  }
  for (const auto& socket : sockets) {
    if (socket != nullptr) socket->Shut();
  }
  for (const auto& stream : streams) {
    if (stream != nullptr) stream->HalfClose();
  }
  const absl::Time deadline =
      absl::Now() + std::min(channels_->options().rpc_timeout, kCloseGrace);
  for (const auto& stream : streams) {
    if (stream != nullptr) stream->WaitFinished(deadline);
  }
  for (const auto& stream : streams) {
    if (stream != nullptr) stream->Cancel("the client was destroyed");
  }
  streams.clear();  // each drains its call, which ends promptly once cancelled
}

void BnCalls::CancelStuckWrites(absl::Time now) {
  std::vector<std::shared_ptr<BnStream>> streams;
  {
    absl::MutexLock lock(&streams_mu_);
    streams = streams_;
  }
  for (const auto& stream : streams) {
    if (stream != nullptr) stream->CancelIfWriteStuck(now);
  }
}

}  // namespace bnps::client::internal
