// Serves a Registry's Prometheus text exposition over HTTP at /metrics, with
// cpp-httplib (Debian's libcpp-httplib-dev) on two threads of its own.
//
//   absl::StatusOr<std::unique_ptr<HttpEndpoint>> e =
//       HttpEndpoint::Start("127.0.0.1", 9100, &registry);
//   // curl -s 127.0.0.1:9100/metrics
//
// Only GET /metrics (and / with a pointer to it) is served; anything else is
// 404. Connections are bounded: at most kMaxConnections are held at once
// (served by the two threads, or waiting for one); past that the endpoint
// accepts no more until one ends, and the rest wait in the kernel's listen
// backlog, so a flood of connections costs the process no memory. A
// connection that sends nothing is closed after kIdleSeconds, and one
// request is served per connection (scrapes come every few seconds at most). Plain HTTP, no authentication: bind it to a loopback or cluster-
// internal address (the binaries' default is 127.0.0.1).
//
// Thread-safety: Stop and the destructor may be called from any thread. The
// registry must outlive the endpoint.

#ifndef BNPS_METRICS_HTTP_ENDPOINT_H_
#define BNPS_METRICS_HTTP_ENDPOINT_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "metrics/registry.h"

namespace bnps::metrics {

class HttpEndpoint {
 public:
  static constexpr int kMaxConnections = 8;
  static constexpr int kIdleSeconds = 2;

  // Binds host:port (port 0 picks a free one) and starts serving.
  // INVALID_ARGUMENT for a port outside [0, 65535]; UNAVAILABLE, naming the
  // address, if it cannot be bound (a port in use is an error: the socket is
  // not shared with SO_REUSEPORT).
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(
      const std::string& host, int port, const Registry* registry);
  ~HttpEndpoint();  // Stop()

  int port() const { return port_; }
  // Stops serving; returns once the server thread ended. Idempotent.
  void Stop();
  // Connections held now (being served or waiting for a thread), for tests
  // and the curious: never more than kMaxConnections.
  int connections_held() const;

 private:
  struct Impl;
  HttpEndpoint() = default;

  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace bnps::metrics

#endif  // BNPS_METRICS_HTTP_ENDPOINT_H_
