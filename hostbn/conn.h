// Conn: one connection of the host's BN aggregator (hostbn/aggregator.h),
// a worker's or a shard's, whose socket is written only by the one thread
// that serves it. Others append frames to its outgoing queue (Send), from
// under whatever lock they hold, without ever waiting on the socket; the
// serving thread, while it waits for the next frame to read (ReadFrame),
// also writes what the socket takes, in the order the frames were queued.
//
// Bounds: a connection whose queue would hold more than `max_queued` bytes,
// or that takes no byte for `timeout` while frames wait, is shut down (its
// reader then sees the connection end), as is one whose write fails.
//
// Thread-safety: Send, WriteNow, Shut and CloseWhenFlushed from any thread;
// ReadFrame from the serving thread alone. The descriptors close with the
// object.

#ifndef BNPS_HOSTBN_CONN_H_
#define BNPS_HOSTBN_CONN_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "google/protobuf/message_lite.h"
#include "proto/bn_frame.h"

namespace bnps::hostbn {

class Conn {
 public:
  // Takes `fd` (a connected non-blocking socket).
  Conn(int fd, absl::Duration timeout, size_t max_queued);
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  int fd() const { return fd_; }

  // Queues `m` as one frame for the serving thread to write. Never waits
  // on the socket. A frame that does not encode, or that would put the
  // queue past max_queued, shuts the connection instead; after a shut,
  // frames are dropped.
  void Send(const google::protobuf::MessageLite& m) ABSL_LOCKS_EXCLUDED(mu_);

  // Writes `m` now, waiting up to `timeout` for room; for handshakes,
  // before anything is queued. Shuts the connection if it cannot.
  void WriteNow(const google::protobuf::MessageLite& m)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Ends the connection now: queued frames are dropped, the reader sees
  // the end. Idempotent.
  void Shut() ABSL_LOCKS_EXCLUDED(mu_);

  // Ends the connection once the frames queued so far (and any queued
  // later) are written, or at the write timeout; reads stop meanwhile.
  void CloseWhenFlushed() ABSL_LOCKS_EXCLUDED(mu_);

  // The next frame's payload, writing queued frames while it waits;
  // UNAVAILABLE at the end of the connection (or once it was shut),
  // DEADLINE_EXCEEDED at `deadline`, INVALID_ARGUMENT past `max_bytes`
  // buffered without a whole frame.
  absl::StatusOr<std::string> ReadFrame(absl::Time deadline,
                                        size_t max_bytes = SIZE_MAX)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Bytes queued and not yet written.
  size_t queued_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Waits until the socket is readable or ended (true) or `deadline`
  // (false), writing queued frames as the socket takes them.
  bool Pump(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes what the socket takes without waiting.
  void WriteSome() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ShutLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Wake();

  const int fd_;
  const int wake_fd_;  // an eventfd: frames were queued, or a close asked
  const absl::Duration timeout_;
  const size_t max_queued_;
  proto::FrameReader reader_;  // the serving thread's
  mutable absl::Mutex mu_;
  std::deque<std::string> out_ ABSL_GUARDED_BY(mu_);  // encoded frames
  size_t written_ ABSL_GUARDED_BY(mu_) = 0;  // of out_.front()
  size_t queued_ ABSL_GUARDED_BY(mu_) = 0;   // bytes in out_ not written
  // The last write progress, or when the queue last became non-empty.
  absl::Time progress_ ABSL_GUARDED_BY(mu_);
  bool shut_ ABSL_GUARDED_BY(mu_) = false;
  bool close_when_flushed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace bnps::hostbn

#endif  // BNPS_HOSTBN_CONN_H_
