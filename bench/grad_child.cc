#include "bench/grad_child.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "server/server_runner.h"
#include "bench/bnps_peer.h"
#include "bench/echo_peer.h"
#include "bench/echo_server.h"
#include "bench/pipe_io.h"
#include "bench/timing.h"
#include "client/grpc_ps_client.h"
#include "util/heap_flags.h"

namespace bnps::bench {
namespace {

constexpr int64_t kMB = 1 << 20;
constexpr int64_t kFloatsPerKey = 1 << 20;

}  // namespace

std::vector<std::pair<std::string, int64_t>> GradKeys(int mb) {
  std::vector<std::pair<std::string, int64_t>> keys;
  for (int64_t left = mb * kMB / 4; left > 0; left -= kFloatsPerKey) {
    keys.emplace_back(absl::StrFormat("mb%d/w%02d", mb, keys.size()),
                      std::min(left, kFloatsPerKey));
  }
  return keys;
}

absl::StatusOr<std::vector<double>> GradReps(bool bnps, int mb, int shards,
                                             int reps) {
  const Clock::time_point deadline =
      Clock::now() +
      absl::ToChronoNanoseconds(kGradChildBudget - absl::Seconds(10));
  std::vector<std::unique_ptr<server::RunningServer>> servers;
  std::vector<std::unique_ptr<EchoServer>> echo_servers;
  std::vector<std::unique_ptr<EchoService::Stub>> stubs;
  std::vector<std::string> addresses;
  for (int i = 0; i < shards; ++i) {
    if (bnps) {
      server::ShardOptions options;
      options.shard = i;
      options.num_shards = shards;
      options.policy = policy::Policy::kSync;
      auto server = server::RunningServer::Start(options, "127.0.0.1:0");
      if (!server.ok()) return server.status();
      addresses.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
      servers.push_back(*std::move(server));
    } else {
      auto echo = EchoServer::Start();
      if (!echo.ok()) return echo.status();
      stubs.push_back((*echo)->NewStub());
      echo_servers.push_back(*std::move(echo));
    }
  }
  const int64_t bytes = mb * kMB;
  std::function<absl::Status(int)> rep;
  std::unique_ptr<client::GrpcPsClient> client;
  std::map<std::string, client::Param> pulled;
  std::shared_ptr<const std::map<std::string, client::Param>> shared;
  std::vector<std::string> sources;  // echo: each stub's share of the bytes
  if (bnps) {
    absl::StatusOr<std::unique_ptr<client::GrpcPsClient>> c =
        client::GrpcPsClient::Connect(ClientOptions(addresses, 0, 1));
    if (!c.ok()) return c.status();
    client = *std::move(c);
    std::map<std::string, client::Param> grads;
    for (const auto& [key, n] : GradKeys(mb)) {
      grads[key] = {{n}, std::vector<float>(n, 1e-4f)};
      pulled[key];
    }
    if (absl::Status s = client->InitParameters(grads); !s.ok()) return s;
    // Sent without a copy (the trainer's way); unchanged between reps.
    shared = std::make_shared<const std::map<std::string, client::Param>>(
        std::move(grads));
    rep = [&](int step) -> absl::Status {
      if (absl::Status s = client->PushGradients(step, 1, shared); !s.ok()) {
        return s;
      }
      return client->PullParametersInto(step + 1, &pulled);
    };
  } else {
    for (int i = 0; i < shards; ++i) {
      const int64_t share =
          bytes / shards + (i == shards - 1 ? bytes % shards : 0);
      sources.emplace_back(share, 'x');
    }
    rep = [&](int) { return EchoPushPull(stubs, sources); };
  }
  std::vector<double> seconds;
  for (int i = 0; i < kGradWarmup + reps && Clock::now() < deadline; ++i) {
    const Clock::time_point t0 = Clock::now();
    if (absl::Status s = rep(i); !s.ok()) return s;
    if (i >= kGradWarmup) seconds.push_back(MicrosSince(t0) * 1e-6);
  }
  if (seconds.empty()) return absl::DeadlineExceededError("no rep was timed");
  return seconds;
}

int GradChildMain(const std::string& spec) {
  std::vector<std::string> f = absl::StrSplit(spec, ',');
  int mb = 0, shards = 0, reps = 0;
  if (f.size() != 4 || (f[0] != "bnps" && f[0] != "echo") ||
      !absl::SimpleAtoi(f[1], &mb) || !absl::SimpleAtoi(f[2], &shards) ||
      !absl::SimpleAtoi(f[3], &reps) || mb < 1 || shards < 1 || reps < 1) {
    absl::FPrintF(stderr,
                  "ps_benchmark: --grad_child=%s is not "
                  "bnps|echo,MB,S,REPS\n",
                  spec);
    return 2;
  }
  absl::StatusOr<std::vector<double>> got =
      GradReps(f[0] == "bnps", mb, shards, reps);
  if (got.ok()) {
    absl::PrintF("reps %s\n",
                 absl::StrJoin(*got, " ", [](std::string* out, double v) {
                   absl::StrAppend(out, absl::StrFormat("%.9g", v));
                 }));
  } else {
    absl::PrintF("error %d %s\n", static_cast<int>(got.status().code()),
                 absl::StrReplaceAll(got.status().message(), {{"\n", " "}}));
  }
  std::fflush(stdout);
  return 0;
}

absl::StatusOr<std::vector<double>> RunGradChild(const std::string& spec) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  const std::string flag = absl::StrCat("--grad_child=", spec);
  // The child's heap is set up as this process's.
  const std::string heap = util::HeapFlagArgument();
  char exe[] = "/proc/self/exe";
  char* argv[] = {exe, const_cast<char*>(flag.c_str()),
                  const_cast<char*>(heap.c_str()), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  pid_t pid = -1;
  const int err = posix_spawn(&pid, exe, &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (err != 0) {
    close(out[0]);
    return absl::InternalError(absl::StrCat("posix_spawn: ", strerror(err)));
  }
  const absl::Time deadline = absl::Now() + kGradChildBudget;
  std::string text;
  char buf[4096];
  ssize_t got;
  while ((got = ReadSome(out[0], buf, sizeof(buf), deadline)) > 0) {
    text.append(buf, got);
  }
  close(out[0]);
  const bool timed_out = got < 0 && absl::Now() >= deadline;
  if (got < 0) kill(pid, SIGKILL);  // past its budget, or its pipe failed
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat("grad child ", spec, " ran past ",
                     absl::FormatDuration(kGradChildBudget)));
  }
  std::vector<std::string> words =
      absl::StrSplit(absl::StripAsciiWhitespace(text), ' ', absl::SkipEmpty());
  if (!words.empty() && words[0] == "reps") {
    std::vector<double> seconds;
    for (size_t i = 1; i < words.size(); ++i) {
      double v;
      if (!absl::SimpleAtod(words[i], &v)) break;
      seconds.push_back(v);
    }
    if (seconds.size() + 1 == words.size() && !seconds.empty()) return seconds;
  }
  int code = 0;
  if (words.size() >= 2 && words[0] == "error" &&
      absl::SimpleAtoi(words[1], &code) && code > 0 && code <= 16) {
    std::vector<std::string> rest(words.begin() + 2, words.end());
    return absl::Status(static_cast<absl::StatusCode>(code),
                        absl::StrJoin(rest, " "));
  }
  return absl::InternalError(absl::StrCat("grad child ", spec,
                                          " ended (wait status ", wstatus,
                                          ") without a result"));
}

}  // namespace bnps::bench
