// Admission: a call's leave to act on a shard, checked once by Shard::Admit
// from what the call's adapter decoded (the gRPC service, its reactors, the
// raw-TCP BN listener). The adapters authenticate the token and decode the
// request; every rule about who may do what lives in Shard::Admit:
//   - the job the request names is the shard's (INVALID_ARGUMENT),
//   - the worker it names is one of the job's (INVALID_ARGUMENT),
//   - the token may act as that worker (PERMISSION_DENIED: a worker's own
//     token used as another worker, under per-worker tokens),
//   - the worker registered with the shard, where asked (FAILED_PRECONDITION),
//   - the shard owns every key the call names (INVALID_ARGUMENT),
//   - a worker's own token holds one live BN connection per transport
//     (FAILED_PRECONDITION for a second; one opened for the shard's
//     generation supersedes one of an older generation, worker_claims.h;
//     a second one of a past generation is told the job rolled on, ABORTED
//     containing proto::kRollsBackText),
//   - the call is of the shard's job generation (ABORTED containing
//     proto::kRollsBackText).
// They are checked in that order; the first that fails is the answer.
//
// An Admission is a guard: the adapter holds it for as long as the call
// acts. While it lives, a generation-checked admission holds off rollbacks
// (the call reaches the store, the BN aggregator or the clocks before a
// rollback or after it, never across; what it calls meanwhile must not
// wait: the components answer through callbacks), and a connection's
// admission holds its worker's claim on the transport.
//
// Thread-safety: an Admission belongs to one owner at a time; it may be
// moved. Destroying it releases what it holds. A generation-checked one
// holds a reader lock: it is released on the thread that was admitted, and
// lives no longer than the synchronous part of a call (a stream admits each
// request that reaches the shard's components anew).

#ifndef BNPS_SERVER_ADMISSION_H_
#define BNPS_SERVER_ADMISSION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "server/worker_claims.h"

namespace bnps::server {

// The transports of BN connections; under per-worker tokens each admits one
// live connection per worker.
enum class BnTransport { kStream, kTcp };

// What a call asks of the shard, as its adapter decoded it.
struct AdmissionRequest {
  // Who the call's token proved the caller is: a worker id, or any worker
  // (Shard::kAnyWorker, security::TokenAuthenticator::kAnyWorker).
  // Default: any worker.
  int caller = -1;
  // The job the request names; unset: it names none (a stream's opening, a
  // status call). Default: unset.
  std::optional<absl::string_view> job;
  // The worker the call acts as; unset: none (a read of the job's state).
  // Needs `job`. Default: unset.
  std::optional<int> worker;
  // The worker must have registered with the shard (BN calls that take
  // part: an id that never registered would be marked as having taken
  // part, and the real worker could not join). Default: false.
  bool registered = false;
  // Keys the call names (parameters, BN layers): each must be this
  // shard's. Not owned. Default: none.
  absl::Span<const std::string> keys;
  // A BN connection of this transport: the caller's claim on it is held
  // while the admission lives (none for a caller that may act as any
  // worker). Default: unset.
  std::optional<BnTransport> connection;
  // With `connection`: the job generation the connection was opened for
  // (its stream's metadata, its hello). Default: 0.
  int64_t connection_generation = 0;
  // The job generation the call carries; set: checked, and rollbacks are
  // held off while the admission lives. Unset: the call is not
  // generation-checked. Default: unset.
  std::optional<int64_t> generation;
};

class Admission {
 public:
  Admission() = default;  // admits nothing and holds nothing
  Admission(Admission&& other) noexcept { *this = std::move(other); }
  Admission& operator=(Admission&& other) noexcept;
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;
  ~Admission() { Release(); }

  // The worker the call was admitted as; -1 if it named none.
  int worker() const { return worker_; }

  // Lets go of what the admission holds (as its destructor would).
  void Release();

 private:
  friend class Shard;

  int worker_ = -1;
  absl::Mutex* rollback_mu_ = nullptr;  // held shared while set
  WorkerClaims* claims_ = nullptr;      // holds claimed_'s claim while set
  int claimed_ = -1;
  uint64_t claim_id_ = 0;
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_ADMISSION_H_
