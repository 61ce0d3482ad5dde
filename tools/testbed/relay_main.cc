// bnps_relay: the test bed's network link (tools/testbed/relay.h). Reads
// commands on stdin and answers each with one line on stdout; prints "ready"
// once every listening address is bound.
//
//   bnps_relay --forward='to1=10.77.1.2:7000>10.77.0.2:7000' --delay_us=100
//   (stdin) cut to1 blackhole | cut to1 rst | heal to1 | delay to1 100 20
//           loss to1 0.01 200000 | stats | quit

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "tools/testbed/relay.h"

ABSL_FLAG(std::vector<std::string>, forward, {},
          "Comma-separated LINK=LISTEN_IP:PORT>TARGET_IP:PORT: listen on the "
          "first address and relay each connection to the second, on the "
          "named link (ports that share a name are cut and healed together).");
ABSL_FLAG(double, delay_us, 0,
          "One-way delay of each direction in microseconds (a round trip "
          "costs twice this).");
ABSL_FLAG(double, jitter_us, 0,
          "Up to this many microseconds more per chunk, uniformly drawn "
          "(order is kept).");
ABSL_FLAG(double, loss, 0,
          "Probability that a chunk pays --loss_penalty_us more (a lost "
          "segment's retransmission).");
ABSL_FLAG(double, loss_penalty_us, 200000, "What a lost chunk costs.");
ABSL_FLAG(double, spin_us, 60,
          "Poll instead of sleeping when the next chunk is due within this "
          "many microseconds (a timer wakes late by tens of microseconds); "
          "0: always sleep.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the jitter and loss draws.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "A TCP relay with delay, jitter, loss and cuts: the test bed's link "
      "(tools/testbed/README.md).");
  absl::ParseCommandLine(argc, argv);
  std::vector<bnps::testbed::Forward> forwards;
  for (const std::string& text : absl::GetFlag(FLAGS_forward)) {
    absl::StatusOr<bnps::testbed::Forward> f = bnps::testbed::ParseForward(text);
    if (!f.ok()) {
      std::fprintf(stderr, "bnps_relay: %s\n",
                   std::string(f.status().message()).c_str());
      return 2;
    }
    forwards.push_back(*f);
  }
  if (forwards.empty()) {
    std::fprintf(stderr, "bnps_relay: no --forward\n");
    return 2;
  }
  bnps::testbed::LinkSettings settings;
  settings.delay_ns = static_cast<int64_t>(absl::GetFlag(FLAGS_delay_us) * 1000);
  settings.jitter_ns =
      static_cast<int64_t>(absl::GetFlag(FLAGS_jitter_us) * 1000);
  settings.loss = absl::GetFlag(FLAGS_loss);
  settings.loss_penalty_ns =
      static_cast<int64_t>(absl::GetFlag(FLAGS_loss_penalty_us) * 1000);
  auto relay = bnps::testbed::Relay::Start(forwards, settings, STDIN_FILENO,
                                           STDOUT_FILENO,
                                           absl::GetFlag(FLAGS_seed),
                                           static_cast<int64_t>(
                                               absl::GetFlag(FLAGS_spin_us) *
                                               1000));
  if (!relay.ok()) {
    std::fprintf(stderr, "bnps_relay: %s\n",
                 std::string(relay.status().message()).c_str());
    return 1;
  }
  (void)!write(STDOUT_FILENO, "ready\n", 6);
  (*relay)->Run();
  return 0;
}
