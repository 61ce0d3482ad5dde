#include "tools/status_view.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"
#include "proto/membership_history.h"
#include "util/json_string.h"

namespace bnps::tools {
namespace {

// "850us", "12.3ms", "4.56s".
std::string Seconds(double s) {
  if (s < 1e-3) return absl::StrFormat("%.0fus", s * 1e6);
  if (s < 1) return absl::StrFormat("%.1fms", s * 1e3);
  return absl::StrFormat("%.2fs", s);
}

std::string Millis(int64_t ms) {
  if (ms < 0) return "-";
  if (ms < 1000) return absl::StrCat(ms, "ms");
  return absl::StrFormat("%.1fs", ms / 1000.0);
}

// `s` cut to `width` characters, the cut marked with '~'.
std::string Fit(const std::string& s, size_t width) {
  if (s.size() <= width) return s;
  return s.substr(0, width - 1) + "~";
}

// An enum's name without its prefix, in lower case: "sync" for POLICY_SYNC.
std::string Short(const std::string& name, absl::string_view prefix) {
  std::string out = absl::AsciiStrToLower(absl::StripPrefix(name, prefix));
  return out;
}

using ::bnps::util::JsonString;

void FormatShard(const ShardAnswer& a, const ViewOptions& options,
                 std::string* out) {
  if (!a.status.has_value()) {
    absl::StrAppend(out, Fit(absl::StrCat(a.address, ": unreachable (", a.error,
                                          ")"),
                             80),
                    "\n");
    return;
  }
  const proto::StatusResponse& r = *a.status;
  const proto::JobConfig& c = r.config();
  std::string policy = Short(proto::Policy_Name(c.policy()), "POLICY_");
  // A pair that is not a --policy shorthand names its gradient mode too.
  if (c.gradients() != proto::GRADIENTS_UNSPECIFIED) {
    policy = absl::StrCat("bn ", policy, "/grad ",
                          Short(proto::Gradients_Name(c.gradients()),
                                "GRADIENTS_"));
  }
  const bool stale = c.policy() == proto::POLICY_ASYNC ||
                     c.gradients() == proto::GRADIENTS_ASYNC;
  absl::StrAppend(
      out,
      Fit(absl::StrFormat("%s: job '%s' shard %d/%d, policy %s%s, %d workers",
                          a.address, c.job(), c.shard(), c.num_shards(), policy,
                          stale ? absl::StrCat(" (staleness ", c.staleness(), ")")
                                : "",
                          c.num_workers()),
          80),
      "\n");
  absl::StrAppend(
      out,
      absl::StrFormat("  parameters %d (min version %d), BN layers %d, worker "
                      "loss: %s\n  pushes %d applied, %d duplicate\n",
                      r.num_parameters(), r.min_version(), r.num_bn_layers(),
                      Short(proto::WorkerLossAction_Name(c.worker_loss()),
                            "WORKER_LOSS_"),
                      r.pushes_applied(), r.pushes_duplicate()));
  if (c.bn_group_size() > 0 || c.bn_group_by_host() || c.has_bn_staleness()) {
    // How the job's BN is shaped: groups and an exact staleness.
    std::vector<std::string> bn;
    if (c.bn_group_size() > 0) {
      bn.push_back(absl::StrCat("groups of ", c.bn_group_size(),
                                " consecutive workers"));
    }
    if (c.bn_group_by_host()) bn.push_back("groups by host");
    if (c.has_bn_staleness()) {
      bn.push_back(absl::StrCat("staleness exactly ", c.bn_staleness(),
                                " steps"));
    }
    absl::StrAppend(out, Fit(absl::StrCat("  BN ", absl::StrJoin(bn, ", ")), 80),
                    "\n");
  }
  if (c.membership_size() > 0) {
    // A job resized while it runs: which workers train from which step.
    absl::StatusOr<proto::MembershipHistory> h =
        proto::MembershipHistory::FromConfig(c);
    absl::StrAppend(
        out,
        Fit(absl::StrCat("  membership ",
                         h.ok() ? absl::StrCat(h->ToString(),
                                               " (FROM_STEP:WORKERS)")
                                : absl::StrCat("malformed: ",
                                               h.status().message())),
            80),
        "\n");
  }
  if (r.job_complete()) {
    absl::StrAppend(out,
                    "  job complete: every worker finished; the final state "
                    "is served for reads\n");
  }
  if (!r.checkpoint_dir().empty() || r.generation() > 0) {
    absl::StrAppend(
        out,
        Fit(absl::StrFormat("  generation %d%s, %d checkpoints, restored step "
                            "%d, in %s",
                            r.generation(),
                            r.needs_rollback() ? " (needs a rollback)" : "",
                            r.checkpoint_steps_size(), r.restored_step(),
                            r.checkpoint_dir().empty() ? "-" : r.checkpoint_dir()),
            80),
        "\n");
  }
  // "worker N: state" as before the columns came: scripts grep for it.
  for (const proto::WorkerStatus& w : r.workers()) {
    std::string line = absl::StrCat("  worker ", w.worker(), ": ",
                                    !w.registered() ? "not registered"
                                    : w.finished()  ? "finished"
                                    : w.live()      ? "live"
                                                    : "LOST");
    if (w.step() >= 0) absl::StrAppend(&line, ", step ", w.step());
    if (w.registered()) absl::StrAppend(&line, ", pushes ", w.pushes());
    if (w.registered() && !w.finished()) {
      absl::StrAppend(&line, ", last heard ", Millis(w.ms_since_heartbeat()),
                      " ago");
    }
    if (w.clock() >= 0) absl::StrAppend(&line, ", clock ", w.clock());
    absl::StrAppend(out, Fit(line, 80), "\n");
  }
  if (r.bn_layers_size() == 0) return;
  std::vector<const proto::BnLayerStatus*> layers;
  for (const proto::BnLayerStatus& l : r.bn_layers()) layers.push_back(&l);
  std::stable_sort(layers.begin(), layers.end(), [](auto* x, auto* y) {
    return x->slowest_wait_seconds() > y->slowest_wait_seconds();
  });
  // The slowest wait of a layer's newest step is how long the first worker
  // there waited for the last one.
  absl::StrAppend(out, absl::StrFormat("  %-24s %-8s %8s  %9s  %7s: %s\n",
                                       "BN layer (slowest first)", "phase",
                                       "messages", "mean wait", "step",
                                       "slowest"));
  const size_t shown = std::min<size_t>(layers.size(), options.max_layers);
  for (size_t i = 0; i < shown; ++i) {
    const proto::BnLayerStatus& l = *layers[i];
    const std::string phase =
        l.phase() == proto::BN_FORWARD    ? "forward"
        : l.phase() == proto::BN_BACKWARD ? "backward"
                                          : proto::BnPhase_Name(l.phase());
    absl::StrAppend(
        out, absl::StrFormat("  %-24s %-8s %8d  %9s  %7s: %s\n",
                             Fit(l.layer(), 24), Fit(phase, 8), l.messages(),
                             Seconds(l.mean_wait_seconds()),
                             absl::StrCat(l.step()),
                             Seconds(l.slowest_wait_seconds())));
  }
  if (layers.size() > shown) {
    absl::StrAppend(out, "  ... ", layers.size() - shown, " more\n");
  }
}

}  // namespace

std::string FormatText(const std::vector<ShardAnswer>& answers,
                       const ViewOptions& options) {
  std::string out;
  for (const ShardAnswer& a : answers) FormatShard(a, options, &out);
  return out;
}

std::string FormatJson(const std::vector<ShardAnswer>& answers) {
  std::string out = "{\"servers\": [";
  for (size_t i = 0; i < answers.size(); ++i) {
    const ShardAnswer& a = answers[i];
    if (i > 0) out += ", ";
    absl::StrAppend(&out, "{\"address\": ", JsonString(a.address), ", ");
    if (a.status.has_value()) {
      std::string status;
      google::protobuf::util::JsonPrintOptions o;
      o.always_print_primitive_fields = true;
      o.preserve_proto_field_names = true;
      if (!google::protobuf::util::MessageToJsonString(*a.status, &status, o)
               .ok()) {
        status = "null";  // cannot happen for a parsed message
      }
      absl::StrAppend(&out, "\"status\": ", status, "}");
    } else {
      absl::StrAppend(&out, "\"error\": ", JsonString(a.error), "}");
    }
  }
  return out + "]}\n";
}

}  // namespace bnps::tools
