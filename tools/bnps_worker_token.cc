// bnps_worker_token: prints worker N's own token, derived from the job token
// (security/worker_token.h), for servers run with --per_worker_tokens.
//
//   bnps_worker_token --job_token_file=job.token --worker=3 > worker3.token

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "security/job_token.h"
#include "security/worker_token.h"
#include "util/command_line.h"

ABSL_FLAG(std::string, job_token_file, "",
          "File holding the job's token (the servers' --token_file).");
ABSL_FLAG(int, worker, -1, "The worker whose token to print (>= 0).");

int main(int argc, char** argv) {
  bnps::util::ParseCommandLine(
      argc, argv,
      "Prints a worker's own token, derived from the job token, for a job "
      "whose servers run with --per_worker_tokens: hand each worker only its "
      "own (bnps_worker --token_file), and keep the job token with the "
      "servers and the operator.\n"
      "  bnps_worker_token --job_token_file=job.token --worker=3 > w3.token\n"
      "Exit status: 0 after printing it or --help; 1 for a token file it "
      "cannot use; 2 for bad flags.");
  const int worker = absl::GetFlag(FLAGS_worker);
  const std::string path = absl::GetFlag(FLAGS_job_token_file);
  if (worker < 0 || path.empty()) {
    std::fprintf(stderr,
                 "bnps_worker_token: give --job_token_file and --worker >= 0\n");
    return bnps::util::kBadFlagsExitCode;
  }
  absl::StatusOr<std::string> token = bnps::security::ReadTokenFile(path);
  if (!token.ok()) {
    std::fprintf(stderr, "bnps_worker_token: %s\n",
                 std::string(token.status().message()).c_str());
    return 1;
  }
  std::printf("%s\n", bnps::security::WorkerToken(*token, worker).c_str());
  return 0;
}
