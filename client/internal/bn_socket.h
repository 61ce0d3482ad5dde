// One shard's BN traffic over raw TCP or a Unix socket (bnps.proto, BnHello;
// server/bn_socket_server.h): the same requests and answers as the BnSync
// stream (bn_stream.h), framed by proto/bn_frame.h, on a connection that
// BnCalls opens when the server advertises a BN port. Like the stream it has
// no thread of its own: a caller waiting for its answer reads the socket
// (polling without sleeping for `spin` first) and hands every answer it
// reads to the call with its id; other callers sleep until theirs comes or
// the reader is done. Internal to client/; one BnTransport (bn_transport.h).
//
// A call's failure says whether repeating it is safe (`retry`): the
// connection broke (the server deduplicates a repeat). A connection that
// broke stays broken; BnCalls opens another or uses the stream. Closing it
// (StartClose, Abort) shuts the socket at once; writes never wait past their
// call's deadline, so CancelIfWriteStuck has nothing to do.
//
// Thread-safety: thread-safe.

#ifndef BNPS_CLIENT_INTERNAL_BN_SOCKET_H_
#define BNPS_CLIENT_INTERNAL_BN_SOCKET_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/internal/bn_transport.h"
#include "proto/bn_frame.h"
#include "proto/bnps.pb.h"

namespace bnps::client::internal {

class BnSocket final : public BnTransport {
 public:
  // Connects to host:port (IPv4), says `hello` and settles its handshake
  // (security/bn_handshake.h) with `token` (the job's or this worker's own;
  // empty for a job without one), which never crosses the wire, until
  // `deadline`. A hello the server refused, or a server that could not
  // prove it holds the job's key: its code and message (UNAUTHENTICATED,
  // FAILED_PRECONDITION, ...). Anything else that fails: UNAVAILABLE.
  static absl::StatusOr<std::unique_ptr<BnSocket>> Connect(
      const std::string& host, int port, const proto::BnHello& hello,
      const std::string& token, absl::Time deadline, absl::Duration spin);
  // The same over the server's Unix socket at `path` (a listener of this
  // host only: bnps_server --bn_unix_socket). UNAVAILABLE too if the
  // process that answers is not `server_incarnation` (another server at the
  // same path on this host).
  // Before the hello, the peer's credentials (SO_PEERCRED) must be this
  // user's or root's: another local user's listener at the path gets
  // nothing, not even the hello.
  static absl::StatusOr<std::unique_ptr<BnSocket>> ConnectUnix(
      const std::string& path, uint64_t server_incarnation,
      const proto::BnHello& hello, const std::string& token,
      absl::Time deadline, absl::Duration spin);
  ~BnSocket() override;

  BnSocket(const BnSocket&) = delete;
  BnSocket& operator=(const BnSocket&) = delete;

  // BnTransport.
  Outcome Call(const proto::BnRequest& request, absl::Time deadline) override
      ABSL_LOCKS_EXCLUDED(mu_, write_mu_);
  bool broken() const override ABSL_LOCKS_EXCLUDED(mu_);
  int64_t generation() const override { return generation_; }
  void CancelIfWriteStuck(absl::Time) override {}
  void StartClose() override { Shut("the client closed the connection"); }
  bool WaitClosed(absl::Time) override { return true; }
  void Abort(absl::string_view why) override { Shut(why); }

  // Breaks the connection: calls waiting fail (retry true) with `why`, later
  // ones too.
  void Shut(absl::string_view why) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Pending {
    bool done = false;
    absl::Status status;
    bool retry = false;
    proto::BnResponse response;
  };

  BnSocket(int fd, int64_t generation, absl::Duration spin)
      : fd_(fd), generation_(generation), spin_(spin) {}
  // Says `hello` to the server at `where` (for messages) and settles the
  // handshake over `transport` ("tcp", "unix"), before the socket is shared; `server_incarnation` (if not null)
  // gets the reply's.
  absl::Status Hello(const std::string& where, const proto::BnHello& hello,
                     const std::string& token, const std::string& transport,
                     absl::Time deadline, uint64_t* server_incarnation);
  // The next frame, read until `deadline`, into `*m`.
  absl::Status ReadHelloFrame(const std::string& where, absl::Time deadline,
                              google::protobuf::MessageLite* m);
  // Reads until at least one whole frame is buffered, `deadline`, or an
  // error (the connection's end included). Called by the reader alone.
  absl::Status ReadSome(absl::Time deadline);
  // Hands the buffered answers to their calls. The reader, under mu_.
  absl::Status Deliver() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BreakLocked(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int fd_;
  const int64_t generation_;
  const absl::Duration spin_;
  absl::Mutex write_mu_;  // one frame written at a time
  mutable absl::Mutex mu_;
  std::map<uint64_t, Pending*> pending_ ABSL_GUARDED_BY(mu_);
  bool reading_ ABSL_GUARDED_BY(mu_) = false;  // a caller reads the socket
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  // The reader's (reading_ set) and, while delivering, mu_'s.
  proto::FrameReader reader_;
};

}  // namespace bnps::client::internal

#endif  // BNPS_CLIENT_INTERNAL_BN_SOCKET_H_
