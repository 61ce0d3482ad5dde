#include "policy/job_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, job, "bnps",
          "The job's name. Servers reject a request for another job; a "
          "worker's must match its servers'.");
ABSL_FLAG(int, num_workers, 1,
          "Workers in the job; the servers' and every worker's must agree.");
ABSL_FLAG(std::string, policy, "",
          "Shorthand for a BN policy and a gradient mode: sync (exact "
          "cross-worker BN every step, bulk-synchronous SGD), async (bounded "
          "staleness: BN statistics merged from a window of --staleness steps, "
          "stale-synchronous SGD), recal (local BN while training, population "
          "statistics over all workers' data afterwards; synchronous SGD), "
          "local (local BN; running statistics averaged at the end; "
          "synchronous SGD). --bn_policy and --gradients choose the two halves "
          "independently; contradicting --policy is an error. Servers: empty "
          "means sync. Workers: empty takes what the servers run; given, it "
          "must match theirs.");
ABSL_FLAG(std::string, bn_policy, "",
          "The BN policy alone: sync | async | recal | local (servers: default "
          "what --policy says, else sync; workers: when given, must match the "
          "servers').");
ABSL_FLAG(std::string, gradients, "",
          "The gradient mode alone: sync (bulk-synchronous) | async (stale-"
          "synchronous within --staleness) (servers: default what --policy "
          "says, else sync; workers: when given, must match the servers').");
ABSL_FLAG(std::optional<int64_t>, staleness, std::nullopt,
          "Async gradients: a worker may begin step c only when every live "
          "worker has completed c - staleness steps. Async BN: statistics "
          "older than c - staleness are not merged. Servers: default 0. "
          "Workers: when given, must match the servers'.");
ABSL_FLAG(std::optional<int>, bn_group_size, std::nullopt,
          "BN within groups: workers 0..K-1, K..2K-1, ... each normalize "
          "with their group's merged statistics, while the running statistics "
          "follow the whole job. K must divide every worker count of the job; "
          "needs --bn_policy=sync or async. Servers: default 0 (no groups: "
          "the whole job). Workers: when given, must match the servers'.");
ABSL_FLAG(std::string, bn_group, "",
          "host: BN within groups of the workers of one host (each worker "
          "reports its --bn_host, else its host name, when it registers), "
          "instead of --bn_group_size; needs --bn_policy=sync or async and a "
          "job that is not resized. Servers: default empty (groups by "
          "--bn_group_size, or none). Workers: when given, must match the "
          "servers'.");
ABSL_FLAG(std::optional<int64_t>, bn_staleness, std::nullopt,
          "Async BN with an exact staleness s: a worker at step t normalizes "
          "with merge(its own moments of step t, the other workers' moments "
          "of step t - s), waiting for them when it runs ahead, and with its "
          "own alone while t < s; needs --bn_policy=async. Servers: default "
          "unset (the bounded mode of --staleness). Workers: when given, "
          "must match the servers'.");
ABSL_FLAG(std::optional<double>, learning_rate, std::nullopt,
          "SGD learning rate, applied on the servers (default 0.1). Workers: "
          "when given, must match the servers'.");
ABSL_FLAG(std::optional<double>, momentum, std::nullopt,
          "SGD momentum, on the servers (default 0.9). Workers: when given, "
          "must match the servers'.");
ABSL_FLAG(std::optional<double>, weight_decay, std::nullopt,
          "SGD weight decay (L2), on the servers (default 0). Workers: when "
          "given, must match the servers'.");
