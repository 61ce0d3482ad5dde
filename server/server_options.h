// What bnps_server runs, from its command line: the flags of the binary
// (defined in server_options.cc, with the job's flags of policy/job_flags.h
// and the metrics flags of metrics/metrics_flags.h) turned into the options
// of RunningServer (server/server_runner.h), checked once.
//
// Example (server/bnps_server.cc):
//   util::ParseCommandLine(argc, argv, usage, env);
//   absl::StatusOr<ServerOptions> options = ServerOptionsFromFlags();
//   if (!options.ok()) ...       // one line naming the flag; exit status 2
//   return RunServer(*options);  // server/server_main.h
//
// Thread-safety: ServerOptionsFromFlags reads the process's flags; call it
// after the command line is parsed, while nothing sets flags.

#ifndef BNPS_SERVER_SERVER_OPTIONS_H_
#define BNPS_SERVER_SERVER_OPTIONS_H_

#include <string>

#include "absl/status/statusor.h"
#include "server/server_runner.h"
#include "server/shard.h"

namespace bnps::server {

// Everything bnps_server needs from its flags.
struct ServerOptions {
  // The shard's options. on_job_complete is unset: RunServer sets it.
  ShardOptions shard;
  // --host and --port: where the gRPC service listens. Default: 127.0.0.1:7000.
  std::string host = "127.0.0.1";
  int port = 7000;
  // --tls_cert, --tls_key, --tls_client_ca, --token_file, --per_worker_tokens.
  ServerSecurity security;
  // How the listening line names the transport: "plaintext", "TLS" or
  // "mutual TLS".
  std::string transport = "plaintext";
  // --keep_awake_us, --bn_port, --bn_unix_socket.
  ServerLatency latency;
  // --bn_max_connections, --bn_max_unauthenticated_per_peer,
  // --bn_memory_budget_mb, --bn_frame_timeout_ms.
  ServerLimits limits;
  // --keep_serving: go on serving reads after the job completes. Default:
  // false (exit once the final checkpoint is written).
  bool keep_serving = false;
};

// The options the flags describe. INVALID_ARGUMENT naming the flag for a
// value out of range or flags that do not go together (--membership that
// does not parse, an unknown --policy, --per_worker_tokens without
// --token_file, --bn_port with --tls_cert, ...); the error of the file for
// an unreadable --tls_* or --token_file. Reads those files; starts nothing.
absl::StatusOr<ServerOptions> ServerOptionsFromFlags();

}  // namespace bnps::server

#endif  // BNPS_SERVER_SERVER_OPTIONS_H_
