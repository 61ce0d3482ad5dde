// RawConn: a client of the raw-TCP BN listener (server/bn_socket_server.h),
// or of its Unix socket, spoken to byte by byte, for tests: blocking, with a 10 s receive timeout
// so that every wait is bounded. Test-only.

#ifndef BNPS_SERVER_RAW_BN_CONN_TESTING_H_
#define BNPS_SERVER_RAW_BN_CONN_TESTING_H_

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "proto/bn_frame.h"
#include "proto/bnps.pb.h"
#include "proto/codec.h"
#include "security/bn_handshake.h"

namespace bnps::server::bn_testing {

// A BN forward request of worker `worker` for layer "bn1", step 0 of job
// "bnps": count 4, the given means, every m2 1.
inline proto::BnRequest Forward(int worker, uint64_t id,
                                std::vector<double> mean = {1.0, 2.0}) {
  bn::Moments m;
  m.count = 4;
  m.mean = mean;
  m.m2.assign(mean.size(), 1.0);
  proto::BnRequest r;
  r.set_id(id);
  r.set_job("bnps");
  r.set_worker(worker);
  r.set_step(0);
  r.set_layer("bn1");
  r.set_phase(proto::BN_FORWARD);
  proto::EncodeMoments(m, r.mutable_moments());
  return r;
}

class RawConn {
 public:
  explicit RawConn(int port, int receive_buffer = 0) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (receive_buffer > 0) {
      setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer,
                 sizeof receive_buffer);
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    const timeval ten{10, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &ten, sizeof ten);
  }
  // To the listener's Unix socket at `path`.
  explicit RawConn(const std::string& unix_path) : transport_("unix") {
    fd_ = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    EXPECT_LT(unix_path.size(), sizeof addr.sun_path);
    memcpy(addr.sun_path, unix_path.data(),
           std::min(unix_path.size(), sizeof addr.sun_path - 1));
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0)
        << unix_path << ": " << strerror(errno);
    const timeval ten{10, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &ten, sizeof ten);
  }
  ~RawConn() { close(fd_); }

  void SendBytes(const std::string& bytes) {
    ASSERT_EQ(send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  // Sends what the peer takes; stops at the first failure.
  void SendAllowingFailure(const std::string& bytes) {
    size_t at = 0;
    const timeval ten{10, 0};
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &ten, sizeof ten);
    while (at < bytes.size()) {
      const ssize_t k =
          send(fd_, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      if (k <= 0) return;
      at += static_cast<size_t>(k);
    }
  }
  void Send(const google::protobuf::MessageLite& m) {
    std::string frame;
    ASSERT_TRUE(proto::AppendFrame(m, &frame).ok());
    SendBytes(frame);
  }
  // The next frame's payload; nullopt once the server ended the connection
  // (a close or a reset). Ten seconds with neither fail the test: a
  // connection the server should have ended but kept would otherwise pass.
  std::optional<std::string> Receive() {
    for (;;) {
      absl::StatusOr<std::optional<absl::string_view>> f = reader_.Next();
      EXPECT_TRUE(f.ok());
      if (f.ok() && f->has_value()) return std::string(**f);
      char buf[4096];
      const ssize_t k = recv(fd_, buf, sizeof buf, 0);
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        ADD_FAILURE() << "no frame and no end of the connection in 10 s";
        return std::nullopt;
      }
      if (k <= 0) return std::nullopt;
      reader_.Append(buf, static_cast<size_t>(k));
    }
  }
  proto::BnHelloReply Hello(const std::string& job, int worker,
                            const std::string& token) {
    proto::BnHello hello;
    hello.set_job(job);
    hello.set_worker(worker);
    return Hello(hello, token);
  }
  // Says `hello` and settles its handshake (security/bn_handshake.h) as a
  // client holding `token` would; the final reply. A client that cannot
  // answer the challenge sends an empty proof (refused).
  proto::BnHelloReply Hello(const proto::BnHello& hello, const std::string& token) {
    security::HelloClient client(hello, token, transport_, "the server");
    Send(client.hello());
    proto::BnHelloReply reply = ReceiveReply();
    if (!reply.challenge()) return reply;
    absl::StatusOr<std::optional<proto::BnHelloProof>> proof =
        client.OnFirstReply(reply);
    proto::BnHelloProof answer;
    if (proof.ok() && proof->has_value()) answer = **proof;
    Send(answer);
    return ReceiveReply();
  }
  proto::BnHelloReply ReceiveReply() {
    proto::BnHelloReply reply;
    std::optional<std::string> bytes = Receive();
    EXPECT_TRUE(bytes.has_value());
    if (bytes) {
      EXPECT_TRUE(reply.ParseFromString(*bytes));
    }
    return reply;
  }

 private:
  int fd_ = -1;
  std::string transport_ = "tcp";
  proto::FrameReader reader_;
};

// Workers 0 and 1, said hello on `a` and `b`, send forwards of means
// {1, 2} (id `id_a`) and {3, 4} (id `id_b`), b's after a's is waiting; the
// answers as they came (a default message for one that did not).
inline std::pair<proto::BnResponse, proto::BnResponse> MeetAtTheBarrier(
    RawConn& a, RawConn& b, uint64_t id_a, uint64_t id_b) {
  a.Send(Forward(0, id_a, {1.0, 2.0}));
  std::thread late([&] { b.Send(Forward(1, id_b, {3.0, 4.0})); });
  std::optional<std::string> got_a = a.Receive();
  late.join();
  std::optional<std::string> got_b = b.Receive();
  std::pair<proto::BnResponse, proto::BnResponse> answers;
  EXPECT_TRUE(got_a && answers.first.ParseFromString(*got_a));
  EXPECT_TRUE(got_b && answers.second.ParseFromString(*got_b));
  return answers;
}

}  // namespace bnps::server::bn_testing

#endif  // BNPS_SERVER_RAW_BN_CONN_TESTING_H_
