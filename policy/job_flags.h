// The flags that describe a job, defined once for every binary that takes
// them (bnps_server, bnps_worker, bnps_status).
//
// The servers own the job: their values are the job's settings, and an unset
// optional flag means the default below. A worker given one of these checks
// it against the servers' when it connects (a guard against launching the
// wrong job); unset, it takes whatever the servers run. So one BNPS_* file
// or launcher line can feed both.
//
//   --job            the job's name (default "bnps")
//   --num_workers    workers in the job (default 1)
//   --policy         shorthand for a BN policy and a gradient mode
//   --bn_policy      the BN policy alone
//   --gradients      the gradient mode alone
//   --staleness      async's bound (servers' default 0)
//   --bn_group_size  BN within groups of K workers (default 0: none)
//   --bn_group       host: BN within groups of the workers of one host
//   --bn_staleness   async BN with the others' moments exactly s steps old
//   --learning_rate  SGD (servers' default 0.1)
//   --momentum       SGD (servers' default 0.9)
//   --weight_decay   SGD L2 (servers' default 0)

#ifndef BNPS_POLICY_JOB_FLAGS_H_
#define BNPS_POLICY_JOB_FLAGS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, job);
ABSL_DECLARE_FLAG(int, num_workers);
ABSL_DECLARE_FLAG(std::string, policy);
ABSL_DECLARE_FLAG(std::string, bn_policy);
ABSL_DECLARE_FLAG(std::string, gradients);
ABSL_DECLARE_FLAG(std::optional<int64_t>, staleness);
ABSL_DECLARE_FLAG(std::optional<int>, bn_group_size);
ABSL_DECLARE_FLAG(std::string, bn_group);
ABSL_DECLARE_FLAG(std::optional<int64_t>, bn_staleness);
ABSL_DECLARE_FLAG(std::optional<double>, learning_rate);
ABSL_DECLARE_FLAG(std::optional<double>, momentum);
ABSL_DECLARE_FLAG(std::optional<double>, weight_decay);

namespace bnps::policy {

// The servers' values of the optional flags when they are not given.
inline constexpr int64_t kDefaultStaleness = 0;
inline constexpr double kDefaultLearningRate = 0.1;
inline constexpr double kDefaultMomentum = 0.9;
inline constexpr double kDefaultWeightDecay = 0.0;

}  // namespace bnps::policy

#endif  // BNPS_POLICY_JOB_FLAGS_H_
