// BnTransport: one shard's connection for BN requests, whatever carries it.
// Two implementations: the gRPC BnSync stream (bn_stream.h) and the raw-TCP
// connection (bn_socket.h). BnCalls (bn_calls.h) picks one per call and
// does the rest on top of this interface alone: ids, deadlines, the repeat
// after a break, the fallback from TCP to the stream, the answer's code.
// Internal to client/.
//
// Thread-safety: implementations are thread-safe; calls from several
// threads share the connection, answers matched to calls by id.

#ifndef BNPS_CLIENT_INTERNAL_BN_TRANSPORT_H_
#define BNPS_CLIENT_INTERNAL_BN_TRANSPORT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/bnps.pb.h"

namespace bnps::client::internal {

class BnTransport {
 public:
  // What one call got: the answer (its own `code` not yet looked at), or
  // why there is none. `retry`: the connection broke under the call, so
  // repeating it on a fresh connection is safe (the server deduplicates).
  struct Outcome {
    absl::Status status;
    bool retry = false;
    proto::BnResponse response;
  };

  virtual ~BnTransport() = default;

  // Sends `request` (its id set, unique among this client's calls) and waits
  // for the answer with that id until `deadline`: DEADLINE_EXCEEDED then.
  virtual Outcome Call(const proto::BnRequest& request,
                       absl::Time deadline) = 0;

  // No more calls can succeed on it: BnCalls opens another.
  virtual bool broken() const = 0;
  // The job generation it was opened in (the server refuses a connection
  // of an earlier one).
  virtual int64_t generation() const = 0;

  // Fails the calls of a write that has waited past its caller's deadline
  // (a peer that stopped reading). The client's background thread calls it
  // every 100 ms.
  virtual void CancelIfWriteStuck(absl::Time now) = 0;

  // Closing: StartClose asks the server to end the connection gracefully
  // and does not wait; WaitClosed waits until it has ended or `deadline`
  // (true if it has); Abort ends it now, failing waiting calls with `why`.
  virtual void StartClose() = 0;
  virtual bool WaitClosed(absl::Time deadline) = 0;
  virtual void Abort(absl::string_view why) = 0;
};

}  // namespace bnps::client::internal

#endif  // BNPS_CLIENT_INTERNAL_BN_TRANSPORT_H_
