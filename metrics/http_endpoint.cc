#include "metrics/http_endpoint.h"

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace bnps::metrics {
namespace {

// httplib's ThreadPool (0.11) queues every accepted connection, without a
// bound. This one holds at most `max` (running or queued): past that,
// enqueue waits, which stops the accept loop until a connection ends.
class BoundedQueue : public httplib::TaskQueue {
 public:
  // `held` (outlives this) mirrors the connections held, for
  // connections_held().
  BoundedQueue(size_t threads, int max, std::atomic<int>* held)
      : pool_(threads), max_(max), mirror_(held) {}
  void enqueue(std::function<void()> fn) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      freed_.wait(lock, [this] { return held_ < max_; });
      *mirror_ = ++held_;
    }
    pool_.enqueue([this, fn = std::move(fn)] {
      fn();
      std::lock_guard<std::mutex> lock(mu_);
      *mirror_ = --held_;
      freed_.notify_one();
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  httplib::ThreadPool pool_;
  const int max_;
  std::atomic<int>* const mirror_;
  std::mutex mu_;
  std::condition_variable freed_;
  int held_ = 0;  // guarded by mu_
};

}  // namespace

struct HttpEndpoint::Impl {
  httplib::Server server;
  std::atomic<bool> ended{false};  // the serving loop returned
  std::atomic<int> held{0};  // connections held (BoundedQueue)
};

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(
    const std::string& host, int port, const Registry* registry) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics port ", port, " is not a port"));
  }
  std::unique_ptr<HttpEndpoint> e(new HttpEndpoint());
  e->impl_ = std::make_unique<Impl>();
  httplib::Server& s = e->impl_->server;
  // Scrapes are rare and short: two threads, not one per core, and a
  // bounded number of connections.
  Impl* impl = e->impl_.get();
  s.new_task_queue = [impl] {
    return new BoundedQueue(2, kMaxConnections, &impl->held);
  };
  s.set_read_timeout(kIdleSeconds, 0);
  s.set_write_timeout(kIdleSeconds, 0);
  s.set_keep_alive_max_count(1);
  s.set_keep_alive_timeout(kIdleSeconds);
  // SO_REUSEADDR only (restarts reuse the port at once); never SO_REUSEPORT,
  // which would let a second process bind the same port and take half the
  // scrapes.
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  s.Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->TextExposition(),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("bnps metrics: see /metrics\n", "text/plain");
  });
  if (port == 0) {
    e->port_ = s.bind_to_any_port(host);
  } else if (s.bind_to_port(host, port)) {
    e->port_ = port;
  }
  if (e->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", host, ":", port,
        " (address in use or not local)"));
  }
  e->thread_ = std::thread([impl] {
    impl->server.listen_after_bind();
    impl->ended = true;
  });
  // httplib's stop() does nothing before the loop runs: wait for it, so that
  // a Stop right after Start is not lost.
  while (!s.is_running() && !impl->ended) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return e;
}

HttpEndpoint::~HttpEndpoint() { Stop(); }

int HttpEndpoint::connections_held() const {
  return impl_ == nullptr ? 0 : impl_->held.load();
}

void HttpEndpoint::Stop() {
  if (impl_ == nullptr) return;
  impl_->server.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace bnps::metrics
