#include "metrics/http_endpoint.h"

#include <sys/socket.h>

#include <atomic>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace bnps::metrics {

struct HttpEndpoint::Impl {
  httplib::Server server;
  std::atomic<bool> ended{false};  // the serving loop returned
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
  // Scrapes are rare and short: two threads, not one per core.
  s.new_task_queue = [] { return new httplib::ThreadPool(2); };
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
  Impl* impl = e->impl_.get();
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

void HttpEndpoint::Stop() {
  if (impl_ == nullptr) return;
  impl_->server.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace bnps::metrics
