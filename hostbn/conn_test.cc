// Conn (hostbn/conn.h) over a Unix socket pair: queued frames reach the
// peer in order, written by the reading thread; a peer that takes nothing
// is cut off at the write timeout, a queue past its cap at once; a close
// asked for comes after the frames queued before it.

#include "hostbn/conn.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "proto/bn_frame.h"
#include "proto/bnps.pb.h"

namespace bnps::hostbn {
namespace {

// A Conn on one end of a socket pair; the test holds the other (blocking,
// with a 10 s receive timeout so that every wait is bounded).
struct Pair {
  explicit Pair(absl::Duration timeout, size_t max_queued = 64 << 20) {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    conn = std::make_unique<Conn>(fds[0], timeout, max_queued);
    peer = fds[1];
    const timeval ten{10, 0};
    setsockopt(peer, SOL_SOCKET, SO_RCVTIMEO, &ten, sizeof ten);
  }
  ~Pair() { close(peer); }

  // The next frame the peer got; nullopt at the end of the connection.
  std::optional<proto::BnResponse> Receive() {
    for (;;) {
      absl::StatusOr<std::optional<absl::string_view>> f = reader.Next();
      EXPECT_TRUE(f.ok());
      if (f.ok() && f->has_value()) {
        proto::BnResponse r;
        EXPECT_TRUE(r.ParseFromString(std::string(**f)));
        return r;
      }
      char buf[64 * 1024];
      const ssize_t k = recv(peer, buf, sizeof buf, 0);
      if (k <= 0) return std::nullopt;
      reader.Append(buf, static_cast<size_t>(k));
    }
  }

  std::unique_ptr<Conn> conn;
  int peer = -1;
  proto::FrameReader reader;
};

proto::BnResponse Answer(uint64_t id, size_t bytes) {
  proto::BnResponse r;
  r.set_id(id);
  r.set_message(std::string(bytes, 'x'));
  return r;
}

TEST(ConnTest, TheReadingThreadWritesQueuedFramesInOrder) {
  Pair p(absl::Seconds(10));
  absl::StatusOr<std::string> got;
  std::thread serving([&] { got = p.conn->ReadFrame(absl::Now() + absl::Seconds(10)); });
  // More than the socket's buffers hold: written as the peer reads.
  for (uint64_t id = 0; id < 64; ++id) p.conn->Send(Answer(id, 64 * 1024));
  for (uint64_t id = 0; id < 64; ++id) {
    std::optional<proto::BnResponse> r = p.Receive();
    ASSERT_TRUE(r.has_value()) << id;
    EXPECT_EQ(r->id(), id);
  }
  EXPECT_EQ(p.conn->queued_bytes(), 0u);
  // Reading goes on meanwhile.
  std::string frame;
  ASSERT_TRUE(proto::AppendFrame(Answer(7, 3), &frame).ok());
  ASSERT_EQ(send(p.peer, frame.data(), frame.size(), 0),
            static_cast<ssize_t>(frame.size()));
  serving.join();
  ASSERT_TRUE(got.ok()) << got.status();
  proto::BnResponse r;
  ASSERT_TRUE(r.ParseFromString(*got));
  EXPECT_EQ(r.id(), 7u);
}

TEST(ConnTest, APeerThatTakesNothingIsCutOffAtTheWriteTimeout) {
  Pair p(absl::Milliseconds(200));
  // Queued at once, never waiting on the socket, though the peer reads
  // nothing.
  for (uint64_t id = 0; id < 32; ++id) p.conn->Send(Answer(id, 256 * 1024));
  EXPECT_GT(p.conn->queued_bytes(), 0u);
  // The serving thread writes what the socket takes, then, with no byte
  // taken for the timeout, shuts the connection: its read ends long
  // before its own deadline.
  absl::StatusOr<std::string> got =
      p.conn->ReadFrame(absl::Now() + absl::Seconds(30));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable)
      << got.status();
  EXPECT_EQ(p.conn->queued_bytes(), 0u);  // freed
  // Frames after the end are dropped.
  p.conn->Send(Answer(99, 1));
  EXPECT_EQ(p.conn->queued_bytes(), 0u);
}

TEST(ConnTest, AQueuePastItsCapIsCutOffAtOnce) {
  Pair p(absl::Seconds(10), /*max_queued=*/1 << 20);
  p.conn->Send(Answer(1, 600 * 1024));
  EXPECT_GT(p.conn->queued_bytes(), 0u);
  p.conn->Send(Answer(2, 600 * 1024));  // past 1 MiB queued
  EXPECT_EQ(p.conn->queued_bytes(), 0u);
  EXPECT_EQ(p.conn->ReadFrame(absl::Now() + absl::Seconds(10)).status().code(),
            absl::StatusCode::kUnavailable);
  // Nothing was written: the peer sees the end alone.
  EXPECT_EQ(p.Receive(), std::nullopt);
}

TEST(ConnTest, ACloseWhenFlushedComesAfterTheQueuedFrames) {
  Pair p(absl::Seconds(10));
  for (uint64_t id = 0; id < 16; ++id) p.conn->Send(Answer(id, 64 * 1024));
  p.conn->CloseWhenFlushed();
  absl::StatusOr<std::string> got;
  std::thread serving([&] { got = p.conn->ReadFrame(absl::Now() + absl::Seconds(10)); });
  for (uint64_t id = 0; id < 16; ++id) {
    std::optional<proto::BnResponse> r = p.Receive();
    ASSERT_TRUE(r.has_value()) << id;
    EXPECT_EQ(r->id(), id);
  }
  EXPECT_EQ(p.Receive(), std::nullopt);  // then the end
  serving.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
}

}  // namespace
}  // namespace bnps::hostbn
