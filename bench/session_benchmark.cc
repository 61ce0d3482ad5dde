// What a session costs a plaintext call (security/call_session.h): the
// median time of a GetStatus round trip through client::JobReader to an
// in-process server on 127.0.0.1, for a job without a token and for one
// with a token (each call signed, verified and checked against the replay
// window), batches of the two alternating in the same run; and the signing
// and verifying alone.
//
//   bazel run -c opt //bench:session_benchmark -- --reps=30 --calls=200

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "client/job_reader.h"
#include "security/call_session.h"
#include "security/worker_token.h"
#include "server/server_runner.h"
#include "util/median_time.h"

ABSL_FLAG(int, reps, 30, "Timed repetitions per measurement (median reported).");
ABSL_FLAG(int, calls, 200, "Calls per repetition.");

namespace bnps {
namespace {

constexpr char kToken[] = "session-benchmark-token-0123456789";

void Die(const absl::Status& s) {
  std::fprintf(stderr, "session_benchmark: %s\n", s.ToString().c_str());
  std::exit(1);
}

// A server with `token` (empty: none) and a reader of it.
struct Job {
  std::unique_ptr<server::RunningServer> server;
  std::unique_ptr<client::JobReader> reader;
};

Job Start(const std::string& token) {
  server::ShardOptions o;
  o.num_workers = 1;
  server::ServerSecurity security;
  security.token = token;
  auto server = server::RunningServer::Start(o, "127.0.0.1:0", security);
  if (!server.ok()) Die(server.status());
  client::JobReaderOptions r;
  r.servers = {absl::StrCat("127.0.0.1:", (*server)->port())};
  r.token = token;
  auto reader = client::JobReader::Create(r);
  if (!reader.ok()) Die(reader.status());
  return {*std::move(server), *std::move(reader)};
}

// Seconds for `calls` GetStatus calls of `job`.
double Batch(Job& job, int calls) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) {
    if (auto st = job.reader->GetStatus(0); !st.ok()) Die(st.status());
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                       start)
      .count();
}

double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

void Run(int reps, int calls) {
  // Batches of the two alternate, so that the machine's load weighs on both
  // alike.
  Job plain_job = Start(""), session_job = Start(kToken);
  Batch(plain_job, calls);
  Batch(session_job, calls);  // opens the session
  std::vector<double> plain_s, session_s;
  for (int i = 0; i < reps; ++i) {
    plain_s.push_back(Batch(plain_job, calls));
    session_s.push_back(Batch(session_job, calls));
  }
  const double plain = Median(plain_s) / calls * 1e6;
  const double session = Median(session_s) / calls * 1e6;

  security::TokenAuthenticator auth(kToken, false, 1);
  security::SessionTable table(&auth, {});
  security::SessionOpener opener("bnps", 0, kToken, "bench");
  auto challenge = table.Handle(opener.Open());
  if (!challenge.ok()) Die(challenge.status());
  auto confirm = opener.OnChallenge(*challenge);
  if (!confirm.ok()) Die(confirm.status());
  if (auto done = table.Handle(*confirm); !done.ok()) Die(done.status());
  std::unique_ptr<security::ClientSession> client = opener.Confirmed();
  const char* method = "/bnps.proto.ParameterServer/GetStatus";
  std::vector<std::string> signed_calls(calls);
  const double sign = util::MedianSeconds(reps, [&] {
    for (std::string& c : signed_calls) c = client->Sign(method, "0");
  });
  const double verify = util::MedianSeconds(reps, [&] {
    for (std::string& c : signed_calls) {
      c = client->Sign(method, "0");
      if (auto v = table.Verify(c, method, "0"); !v.ok()) Die(v.status());
    }
  });

  std::printf("| what | us per call | ratio to the plaintext round trip |\n");
  std::printf("|---|---|---|\n");
  std::printf("| GetStatus round trip, no token | %.1f | 1.00 |\n", plain);
  std::printf("| GetStatus round trip, token without TLS (session) | %.1f | %.2f |\n",
              session, session / plain);
  std::printf("| sign a call (client) | %.2f | %.3f |\n", sign / calls * 1e6,
              sign / calls * 1e6 / plain);
  std::printf("| sign and verify a call (client and server) | %.2f | %.3f |\n",
              verify / calls * 1e6, verify / calls * 1e6 / plain);
}

}  // namespace
}  // namespace bnps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  bnps::Run(absl::GetFlag(FLAGS_reps), absl::GetFlag(FLAGS_calls));
  return 0;
}
