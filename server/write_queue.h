// WriteQueue: the messages of one gRPC server stream waiting to be written.
// gRPC takes one write at a time per stream; the queue keeps the rest in
// order, with the message being written at its front (gRPC reads it until
// its write is done). With a cap, the bytes held (the message being written
// included) stay within the cap and are charged to a budget shared with
// other streams: a message past either breaks the queue (the client is not
// reading), and a failed write breaks it too. A broken queue drops what it
// holds and takes no more.
//
// Example (a reactor, under its own mutex):
//   const grpc::ByteBuffer* start;
//   { absl::MutexLock lock(&mu_); start = queue_.Push(std::move(m)); }
//   if (start != nullptr) StartWrite(start);
//   ...
//   void OnWriteDone(bool ok) override {
//     const grpc::ByteBuffer* next;
//     { absl::MutexLock lock(&mu_); next = queue_.WriteDone(ok); }
//     if (next != nullptr) StartWrite(next); else MaybeFinish();
//   }
//
// Thread-safety: thread-compatible. The owning reactor calls it under its
// own mutex (which also guards what decides when its stream ends) and calls
// StartWrite with what it returns after unlocking.

#ifndef BNPS_SERVER_WRITE_QUEUE_H_
#define BNPS_SERVER_WRITE_QUEUE_H_

#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <utility>

#include "grpcpp/grpcpp.h"
#include "util/byte_budget.h"

namespace bnps::server {

class WriteQueue {
 public:
  // No cap and no budget.
  WriteQueue() = default;
  // At most `cap` bytes held, charged to `budget` (not null).
  WriteQueue(int64_t cap, std::shared_ptr<util::ByteBudget> budget)
      : cap_(cap), budget_(std::move(budget)) {}
  WriteQueue(const WriteQueue&) = delete;
  WriteQueue& operator=(const WriteQueue&) = delete;
  ~WriteQueue() { Close(); }

  // Queues `m` unless the queue is broken. Returns the message to start
  // writing now, or null (a write is in flight, or the queue is broken).
  // A message past the cap or the budget breaks the queue; `*cut_at` (if
  // given) is then set to the bytes the queue would have held, and stays
  // untouched otherwise.
  const grpc::ByteBuffer* Push(grpc::ByteBuffer m, int64_t* cut_at = nullptr);

  // The write in flight is done; `ok` false (it failed: the client went
  // away) breaks the queue. Returns the next message to write, or null (no
  // write is in flight now). REQUIRES: writing().
  const grpc::ByteBuffer* WriteDone(bool ok);

  // A write is in flight.
  bool writing() const { return writing_; }
  // A write failed or the cap was passed: nothing more is written.
  bool broken() const { return broken_; }
  // Bytes held (charged to the budget).
  int64_t held() const { return held_; }

  // Drops everything and gives its bytes back to the budget; for when gRPC
  // is done with the stream (no write is in flight any more).
  void Close();

 private:
  void PopBack();
  // Drops all but the message being written.
  void DropQueued();

  const int64_t cap_ = std::numeric_limits<int64_t>::max();
  const std::shared_ptr<util::ByteBudget> budget_;  // null: none
  std::deque<grpc::ByteBuffer> queue_;  // front: being written if writing_
  int64_t held_ = 0;
  bool writing_ = false;
  bool broken_ = false;
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_WRITE_QUEUE_H_
