// BN traffic over raw TCP (bnps_server --bn_port, GrpcClientOptions::
// bn_over_tcp) and over the listener's Unix socket (--bn_unix_socket,
// GrpcClientOptions::bn_unix) on real servers on 127.0.0.1, against the
// gRPC stream: the same answers bit for bit, the connection really used
// (the listener counts its connections, those over the Unix socket apart),
// a Unix path that is gone leaves the worker on TCP, and a listener that
// goes away leaves the calls on the stream instead of failing them; a
// listener another user planted at the path hears nothing.

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/grpc_ps_client.h"
#include "grpcpp/security/server_credentials.h"
#include "gtest/gtest.h"
#include "server/server_runner.h"

namespace bnps {
namespace {

using client::GrpcPsClient;

class Job {
 public:
  // S shards of a sync job of `workers`; bn_port -1: no TCP listener;
  // unix_path non-empty: a Unix socket too ("auto": one per shard).
  Job(int shards, int workers, int bn_port, const std::string& unix_path = "")
      : workers_(workers) {
    server::ShardOptions o;
    o.num_shards = shards;
    o.num_workers = workers;
    server::ServerLatency latency;
    latency.bn_port = bn_port;
    latency.bn_unix_path = unix_path;
    for (int s = 0; s < shards; ++s) {
      o.shard = s;
      auto r = server::RunningServer::Start(o, "127.0.0.1:0", {}, {}, latency);
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) continue;
      addresses_.push_back("127.0.0.1:" + std::to_string((*r)->port()));
      servers_.push_back(*std::move(r));
    }
  }

  std::unique_ptr<GrpcPsClient> Connect(int worker, bool over_tcp = true,
                                        bool unix = true) {
    client::GrpcClientOptions o;
    o.servers = addresses_;
    o.job = "bnps";
    o.worker = worker;
    o.num_workers = workers_;
    o.rpc_timeout = absl::Seconds(20);
    o.bn_over_tcp = over_tcp;
    o.bn_unix = unix;
    auto c = GrpcPsClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  server::RunningServer& server(int s) { return *servers_[s]; }
  int shards() const { return static_cast<int>(servers_.size()); }
  // Connections the shards' TCP listeners accepted, summed.
  int64_t accepted() {
    int64_t n = 0;
    for (auto& s : servers_) {
      if (s->bn_socket_server() != nullptr) n += s->bn_socket_server()->accepted();
    }
    return n;
  }
  // Of those, the ones over the Unix sockets.
  int64_t accepted_unix() {
    int64_t n = 0;
    for (auto& s : servers_) {
      if (s->bn_socket_server() != nullptr) {
        n += s->bn_socket_server()->accepted_unix();
      }
    }
    return n;
  }

 private:
  const int workers_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<server::RunningServer>> servers_;
};

// Worker w's moments of `layer` at `step`: distinct per worker, step, layer.
bn::Moments MomentsOf(int w, int64_t step, int layer) {
  bn::Moments m;
  m.count = 3 + w;
  for (int c = 0; c < 5; ++c) {
    m.mean.push_back(0.1 * (w + 1) * (c + 1) + 0.01 * step + 0.3 * layer);
    m.m2.push_back(1.0 + 0.2 * w + 0.05 * c + 0.01 * step);
  }
  return m;
}

bn::BackwardSums SumsOf(int w, int64_t step, int layer) {
  bn::BackwardSums s;
  for (int c = 0; c < 5; ++c) {
    s.sum_dy.push_back(0.5 * (w + 1) - 0.1 * c + 0.01 * step + 0.2 * layer);
    s.sum_dy_xhat.push_back(-0.25 * w + 0.03 * c + 0.02 * step);
  }
  return s;
}

// Every double each worker got back over `steps` steps of forward and
// backward exchanges of four layers (spread over the shards), W workers on
// threads of their own.
std::vector<std::vector<double>> Exchange(std::vector<GrpcPsClient*> clients,
                                          int steps) {
  const int workers = static_cast<int>(clients.size());
  std::vector<std::vector<double>> got(workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (int64_t step = 0; step < steps; ++step) {
        for (int layer = 0; layer < 4; ++layer) {
          const std::string name = "bn" + std::to_string(layer);
          auto f = clients[w]->BnForward(name, step, MomentsOf(w, step, layer));
          ASSERT_TRUE(f.ok()) << f.status();
          EXPECT_EQ(f->contributors, workers);
          got[w].push_back(static_cast<double>(f->merged.count));
          got[w].insert(got[w].end(), f->merged.mean.begin(), f->merged.mean.end());
          got[w].insert(got[w].end(), f->merged.m2.begin(), f->merged.m2.end());
        }
        for (int layer = 3; layer >= 0; --layer) {
          const std::string name = "bn" + std::to_string(layer);
          auto b = clients[w]->BnBackward(name, step, SumsOf(w, step, layer));
          ASSERT_TRUE(b.ok()) << b.status();
          got[w].insert(got[w].end(), b->sum_dy.begin(), b->sum_dy.end());
          got[w].insert(got[w].end(), b->sum_dy_xhat.begin(), b->sum_dy_xhat.end());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return got;
}

// The exchanges of a 2-shard, 2-worker job over `transport`: "stream",
// "tcp" or "unix", checking that the connections went where asked.
std::vector<std::vector<double>> ExchangeOver(const std::string& transport) {
  const int bn_port = transport == "stream" ? -1 : 0;
  Job job(2, 2, bn_port, transport == "unix" ? "auto" : "");
  EXPECT_EQ(job.shards(), 2);
  if (job.shards() != 2) return {};
  auto a = job.Connect(0), b = job.Connect(1);
  EXPECT_TRUE(a && b);
  if (!a || !b) return {};
  std::vector<std::vector<double>> got = Exchange({a.get(), b.get()}, 3);
  // Each worker connected once to each shard that owns a layer.
  EXPECT_EQ(job.accepted(), transport == "stream" ? 0 : 2 * 2);
  EXPECT_EQ(job.accepted_unix(), transport == "unix" ? 2 * 2 : 0);
  return got;
}

TEST(BnOverTcpTest, TheSameBitsOverTcpAndAUnixSocketAsTheStream) {
  const std::vector<std::vector<double>> over_stream = ExchangeOver("stream");
  ASSERT_EQ(over_stream.size(), 2u);
  for (const std::string transport : {"tcp", "unix"}) {
    const std::vector<std::vector<double>> got = ExchangeOver(transport);
    ASSERT_EQ(got.size(), over_stream.size()) << transport;
    for (size_t w = 0; w < got.size(); ++w) {
      ASSERT_EQ(got[w].size(), over_stream[w].size());
      EXPECT_EQ(std::memcmp(got[w].data(), over_stream[w].data(),
                            got[w].size() * sizeof(double)),
                0)
          << transport << ", worker " << w;
    }
    EXPECT_EQ(got[0], got[1]);  // both got the global statistics
  }
}

TEST(BnOverTcpTest, AClientMayKeepToTcp) {
  Job job(1, 1, /*bn_port=*/0, "auto");
  auto c = job.Connect(0, /*over_tcp=*/true, /*unix=*/false);
  ASSERT_TRUE(c);
  Exchange({c.get()}, 2);
  EXPECT_EQ(job.accepted(), 1);
  EXPECT_EQ(job.accepted_unix(), 0);
}

TEST(BnOverTcpTest, AUnixPathThatIsGoneFallsBackToTcp) {
  Job job(1, 1, /*bn_port=*/0, "auto");
  ASSERT_EQ(job.shards(), 1);
  const std::string path = job.server(0).bn_socket_server()->unix_path();
  ASSERT_FALSE(path.empty());
  ASSERT_EQ(unlink(path.c_str()), 0);  // the listener stays; the path is gone
  auto c = job.Connect(0);
  ASSERT_TRUE(c);
  Exchange({c.get()}, 2);
  EXPECT_EQ(job.accepted(), 1);
  EXPECT_EQ(job.accepted_unix(), 0);
}

TEST(BnOverTcpTest, AClientMayKeepToTheStream) {
  Job job(1, 1, /*bn_port=*/0);
  auto c = job.Connect(0, /*over_tcp=*/false);
  ASSERT_TRUE(c);
  Exchange({c.get()}, 2);
  EXPECT_EQ(job.accepted(), 0);
}

// Another server at the path the shard advertised (its own file removed):
// the hello's server incarnation is not the shard's, so the worker takes
// the shard's TCP port instead of another server's barriers.
TEST(BnOverTcpTest, AnotherServerAtTheUnixPathIsNotTaken) {
  const std::string path =
      "/tmp/bnps-test-" + std::to_string(getpid()) + "-shared.sock";
  Job job(1, 1, /*bn_port=*/0, path);
  ASSERT_EQ(job.shards(), 1);
  ASSERT_EQ(unlink(path.c_str()), 0);
  Job other(1, 1, /*bn_port=*/0, path);  // same job name, worker and token
  ASSERT_EQ(other.shards(), 1);
  auto o = other.Connect(0);  // registers worker 0 there too
  ASSERT_TRUE(o);
  Exchange({o.get()}, 1);
  EXPECT_EQ(other.accepted_unix(), 1);
  auto c = job.Connect(0);
  ASSERT_TRUE(c);
  Exchange({c.get()}, 2);
  EXPECT_EQ(other.accepted_unix(), 2);  // c's hello, answered and left
  EXPECT_EQ(job.accepted(), 1);
  EXPECT_EQ(job.accepted_unix(), 0);
}

// A listener of another user (uid 65534, in a forked child) at
// the path the shard advertised, its own file removed: the worker sees the
// peer's uid, sends nothing -- not even the hello, which names the worker
// -- and takes the shard's TCP port. Needs root (to be another user).
TEST(BnOverTcpTest, AnotherUsersListenerAtTheUnixPathHearsNothing) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root to run a listener as another user";
  }
  const std::string path =
      "/tmp/bnps-test-" + std::to_string(getpid()) + "-planted.sock";
  int go[2], ready[2], stop[2];
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(stop), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The planted listener: waits for `go`, binds the path as uid 65534,
    // says `ready`, then counts connections and bytes until `stop` closes,
    // and writes both counts to `ready`.
    char c;
    if (read(go[0], &c, 1) != 1) _exit(2);
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    const int l = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    if (l < 0 || bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        listen(l, 8) != 0) {
      _exit(4);
    }
    if (write(ready[1], "r", 1) != 1) _exit(5);
    int64_t counts[2] = {0, 0};  // connections, bytes
    std::vector<int> conns;
    for (int rounds = 0; rounds < 600; ++rounds) {  // 60 s at most
      std::vector<pollfd> fds = {{stop[0], POLLIN, 0}, {l, POLLIN, 0}};
      for (int fd : conns) fds.push_back({fd, POLLIN, 0});
      if (poll(fds.data(), fds.size(), 100) < 0) break;
      if (fds[0].revents != 0) break;
      if (fds[1].revents & POLLIN) {
        const int fd = accept(l, nullptr, nullptr);
        if (fd >= 0) {
          ++counts[0];
          conns.push_back(fd);
        }
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        char buf[256];
        if (fds[i].revents & POLLIN) {
          const ssize_t n = read(fds[i].fd, buf, sizeof buf);
          if (n > 0) counts[1] += n;
        }
      }
    }
    if (write(ready[1], counts, sizeof counts) != sizeof counts) _exit(6);
    unlink(path.c_str());
    _exit(0);
  }
  close(go[0]);
  close(ready[1]);
  close(stop[0]);
  {
    Job job(1, 1, /*bn_port=*/0, path);
    ASSERT_EQ(job.shards(), 1);
    ASSERT_EQ(unlink(path.c_str()), 0);
    char c;
    ASSERT_EQ(write(go[1], "g", 1), 1);
    ASSERT_EQ(read(ready[0], &c, 1), 1);
    auto w = job.Connect(0);
    ASSERT_TRUE(w);
    Exchange({w.get()}, 2);
    EXPECT_EQ(job.accepted(), 1);  // the shard's TCP port
    EXPECT_EQ(job.accepted_unix(), 0);
  }
  close(stop[1]);  // the listener reports and ends
  int64_t counts[2] = {-1, -1};
  EXPECT_EQ(read(ready[0], counts, sizeof counts),
            static_cast<ssize_t>(sizeof counts));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(counts[0], 1);  // the worker connected,
  EXPECT_EQ(counts[1], 0);  // and sent it nothing
  close(go[1]);
  close(ready[0]);
}

TEST(BnOverTcpTest, AListenerThatGoesAwayLeavesTheCallsOnTheStream) {
  Job job(1, 2, /*bn_port=*/0);
  auto a = job.Connect(0), b = job.Connect(1);
  ASSERT_TRUE(a && b);
  Exchange({a.get(), b.get()}, 1);
  EXPECT_EQ(job.accepted(), 2);
  // The listener stops (its connections end, mid-job); later exchanges go
  // over the stream, and none fails or is merged twice.
  job.server(0).StopBnSocketServer();
  std::vector<std::vector<double>> after = Exchange({a.get(), b.get()}, 2);
  EXPECT_EQ(after[0], after[1]);
  EXPECT_EQ(job.accepted(), 2);
}

// An answer over the 8 MiB message limit (a forward with
// want_running at 300,000 channels) is an error the worker's call returns,
// naming the reason, on either transport; the connection stays usable.
TEST(BnOverTcpTest, AnAnswerTooLargeIsAnErrorTheWorkerSees) {
  for (bool over_tcp : {true, false}) {
    Job job(1, 1, /*bn_port=*/0);
    auto c = job.Connect(0, over_tcp);
    ASSERT_TRUE(c);
    bn::Moments wide;
    wide.count = 4;
    wide.mean.assign(300000, 1.0);
    wide.m2.assign(300000, 1.0);
    absl::StatusOr<client::BnForwardResult> r =
        c->BnForward("bn1", 0, wide, /*want_running=*/true);
    ASSERT_FALSE(r.ok()) << "over_tcp " << over_tcp;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted)
        << r.status();
    EXPECT_NE(r.status().message().find("more than a message may"),
              std::string::npos)
        << r.status();
    Exchange({c.get()}, 1);  // the next exchanges are served
    EXPECT_EQ(job.accepted(), over_tcp ? 1 : 0);
  }
}

TEST(BnOverTcpTest, TheServerRefusesTlsAndPortsOutOfRange) {
  {
    // A Unix socket is plaintext too: with TLS it is refused like the port.
    server::ServerLatency latency;
    latency.bn_port = 0;
    latency.bn_unix_path = "auto";
    server::ServerSecurity tls;
    tls.credentials = grpc::InsecureServerCredentials();
    EXPECT_EQ(server::RunningServer::Start({}, "127.0.0.1:0", tls, {}, latency)
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument);
  }
  server::ServerLatency latency;
  latency.bn_port = 70000;
  EXPECT_EQ(server::RunningServer::Start({}, "127.0.0.1:0", {}, {}, latency)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  latency.bn_port = 0;
  server::ServerSecurity tls;
  tls.credentials = grpc::InsecureServerCredentials();  // stands for TLS here
  EXPECT_EQ(server::RunningServer::Start({}, "127.0.0.1:0", tls, {}, latency)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace bnps
