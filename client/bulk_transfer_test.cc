// GrpcPsClient against fake shards: the bulk calls (init, push in parts,
// whole and layer-by-layer pulls).

#include "client/grpc_ps_client.h"
#include "client/grpc_ps_client_testing.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bn/moments.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "gtest/gtest.h"
#include "proto/bnps.grpc.pb.h"
#include "proto/codec.h"
#include "proto/limits.h"
#include "proto/sharding.h"

namespace bnps::client {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;
using fakes::GrpcPsClientTest;
using fakes::FakeShard;
using fakes::kShards;
using fakes::KeyOnShard;
using fakes::MakeParam;
using fakes::SameParam;

TEST_F(GrpcPsClientTest, InitParametersRoutesKeysToTheirShards) {
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  std::map<std::string, Param> params;
  for (int i = 0; i < 10; ++i) {
    params[absl::StrCat("layer", i, ".weight")] = MakeParam({3, i + 1}, i);
  }
  // Larger than half a message: the client splits a shard's keys over calls.
  params[KeyOnShard(0, "big")] = MakeParam({1500000}, 7);
  params[KeyOnShard(0, "big", 1)] = MakeParam({1500000}, 8);
  ASSERT_TRUE(client->InitParameters(params).ok());
  for (int s = 0; s < kShards; ++s) {
    std::map<std::string, Param> got = fakes_[s]->params();
    for (const auto& [key, p] : params) {
      if (proto::ShardForKey(key, kShards) == s) {
        ASSERT_EQ(got.count(key), 1u) << key;
        EXPECT_TRUE(SameParam(got[key], p)) << key;
      } else {
        EXPECT_EQ(got.count(key), 0u) << key << " on shard " << s;
      }
    }
  }
  // Too large for one message: refused before anything is sent.
  std::map<std::string, Param> huge;
  huge["huge"] = MakeParam({3000000}, 1);
  EXPECT_EQ(client->InitParameters(huge).code(),
            absl::StatusCode::kInvalidArgument);
  // A shape that does not match the values.
  std::map<std::string, Param> bad;
  bad["bad"] = Param{{2, 2}, {1, 2, 3}};
  EXPECT_EQ(client->InitParameters(bad).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(GrpcPsClientTest, PushGradientsRoutesAndChunks) {
  std::unique_ptr<GrpcPsClient> client = Connect(Options(/*worker=*/1));
  ASSERT_NE(client, nullptr);
  std::map<std::string, Param> grads;
  for (int i = 0; i < 8; ++i) {
    grads[absl::StrCat("conv", i, ".weight")] = MakeParam({4, 3, 3, 3}, i);
  }
  const std::string big = KeyOnShard(1, "fc.weight");
  grads[big] = MakeParam({3000, 1000}, 0.5f);  // 3M floats: 12 chunks
  grads[KeyOnShard(0, "empty")] = MakeParam({0, 5}, 0);
  ASSERT_TRUE(
      client->PushGradients(/*step=*/7, /*num_samples=*/32, grads).ok());

  for (int s = 0; s < kShards; ++s) {
    std::vector<FakeShard::Push> pushes = fakes_[s]->pushes();
    ASSERT_EQ(pushes.size(), 1u) << "shard " << s;
    const FakeShard::Push& push = pushes[0];
    EXPECT_EQ(push.worker, 1);
    EXPECT_EQ(push.step, 7);
    EXPECT_EQ(push.num_samples, 32);
    EXPECT_LE(push.largest_message,
              static_cast<size_t>(proto::kBulkMessageBytes));
    std::vector<std::string> want;
    for (const auto& [key, p] : grads) {
      if (proto::ShardForKey(key, kShards) != s) continue;
      want.push_back(key);
      ASSERT_EQ(push.grads.count(key), 1u) << key;
      EXPECT_TRUE(SameParam(push.grads.at(key), p)) << key;
    }
    std::vector<std::string> got;
    for (const auto& [key, p] : push.grads) got.push_back(key);
    EXPECT_THAT(got, UnorderedElementsAreArray(want));
    if (s == 1) {
      EXPECT_GE(push.messages, 12);  // 12 chunks of 1 MB, one per message
    }
  }
  EXPECT_EQ(client->PushGradients(-1, 1, grads).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(GrpcPsClientTest, PushGradientsRetriesUnavailable) {
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  fakes_[0]->set_failing_pushes(1);
  std::map<std::string, Param> grads;
  const std::string key = KeyOnShard(0, "w");
  grads[key] = MakeParam({100}, 1);
  ASSERT_TRUE(client->PushGradients(3, 8, grads).ok());
  EXPECT_EQ(fakes_[0]->push_calls(), 2);
  ASSERT_EQ(fakes_[0]->pushes().size(), 1u);
  EXPECT_TRUE(SameParam(fakes_[0]->pushes()[0].grads.at(key), grads[key]));
  EXPECT_EQ(fakes_[1]->push_calls(), 0);  // it owns none of the keys

  // More failures than attempts: the last status comes back.
  fakes_[0]->set_failing_pushes(100);
  GrpcClientOptions options = Options();
  options.max_attempts = 3;
  std::atomic<int> retries{0};
  options.on_retry = [&retries](absl::StatusCode code) {
    EXPECT_EQ(code, absl::StatusCode::kUnavailable);
    ++retries;
  };
  std::unique_ptr<GrpcPsClient> impatient = Connect(options);
  ASSERT_NE(impatient, nullptr);
  const int before = fakes_[0]->push_calls();
  absl::Status s = impatient->PushGradients(4, 8, grads);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("shard 0"));
  EXPECT_EQ(fakes_[0]->push_calls() - before, 3);
  EXPECT_EQ(retries.load(), 2);  // between the three attempts
}

// StartPush: Add hands a part over and returns while the shards still hold
// it; Finish waits for the answers. Every key arrives once, intact, with the
// step's number and sample count.
TEST_F(GrpcPsClientTest, PushInPartsReturnsFromAddWhileTheShardsHoldIt) {
  GrpcClientOptions options = Options(/*worker=*/1);
  options.push_part_bytes = 0;  // every part as it comes
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  auto a = std::make_shared<Params>();
  auto b = std::make_shared<Params>();
  for (int s = 0; s < kShards; ++s) {
    (*a)[KeyOnShard(s, "a")] = MakeParam({3, 4}, s);
    (*b)[KeyOnShard(s, "b")] = MakeParam({5}, 10 + s);
  }
  (*b)[KeyOnShard(1, "fc")] = MakeParam({3000, 1000}, 0.5f);  // chunked
  for (auto& fake : fakes_) fake->set_hold_pushes(true);
  std::unique_ptr<GradientPush> push =
      client->StartPush(/*step=*/5, /*num_samples=*/16);
  push->Add(a);
  push->Add(b);
  // Both Adds returned with every push held: none waited for an answer. The
  // first part is on its way before Finish.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (fakes_[0]->push_calls() + fakes_[1]->push_calls() == 0 &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_GT(fakes_[0]->push_calls() + fakes_[1]->push_calls(), 0);
  for (auto& fake : fakes_) fake->set_hold_pushes(false);
  ASSERT_TRUE(push->Finish().ok());

  Params want = *a;
  want.insert(b->begin(), b->end());
  Params got;
  for (int s = 0; s < kShards; ++s) {
    for (const FakeShard::Push& p : fakes_[s]->pushes()) {
      EXPECT_EQ(p.worker, 1);
      EXPECT_EQ(p.step, 5);
      EXPECT_EQ(p.num_samples, 16);
      for (const auto& [key, g] : p.grads) {
        EXPECT_TRUE(got.emplace(key, g).second) << key << " came twice";
      }
    }
  }
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [key, g] : want) {
    ASSERT_EQ(got.count(key), 1u) << key;
    EXPECT_TRUE(SameParam(got.at(key), g)) << key;
  }
}

// A part that fails does not stop the others: Finish returns its error
// once every other part was answered.
TEST_F(GrpcPsClientTest, PushInPartsReportsAFailedPartAfterTheRest) {
  GrpcClientOptions options = Options(/*worker=*/1);
  options.push_part_bytes = 0;
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  const std::string bad = KeyOnShard(0, "bad");
  fakes_[0]->set_failing_key(bad);
  auto first = std::make_shared<Params>();
  (*first)[KeyOnShard(1, "first")] = MakeParam({7}, 1);
  auto failing = std::make_shared<Params>();
  (*failing)[bad] = MakeParam({7}, 2);
  auto last = std::make_shared<Params>();
  (*last)[KeyOnShard(1, "last")] = MakeParam({7}, 3);
  std::unique_ptr<GradientPush> push = client->StartPush(6, 8);
  push->Add(first);
  push->Add(failing);
  push->Add(last);
  const absl::Status s = push->Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("PushGradients of step 6 to shard 0"));
  EXPECT_THAT(s.message(), HasSubstr("no parameter " + bad));
  std::set<std::string> on_shard_1;
  for (const FakeShard::Push& p : fakes_[1]->pushes()) {
    for (const auto& [key, g] : p.grads) on_shard_1.insert(key);
  }
  EXPECT_EQ(on_shard_1, (std::set<std::string>{first->begin()->first,
                                               last->begin()->first}));
  EXPECT_TRUE(fakes_[0]->pushes().empty());
  // Bad arguments come back from Finish as well.
  std::unique_ptr<GradientPush> negative = client->StartPush(-1, 8);
  negative->Add(first);
  EXPECT_EQ(negative->Finish().code(), absl::StatusCode::kInvalidArgument);
}

// Parts smaller than push_part_bytes wait for more: small ones go together
// in Finish, one call per shard; once enough bytes are in they are sent.
TEST_F(GrpcPsClientTest, PushInPartsSendsOnceEnoughBytesAreIn) {
  GrpcClientOptions options = Options(/*worker=*/1);
  options.push_part_bytes = 4000;
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  std::unique_ptr<GradientPush> push = client->StartPush(2, 4);
  for (int i = 0; i < 3; ++i) {
    auto part = std::make_shared<Params>();
    (*part)[KeyOnShard(1, "small", i)] = MakeParam({100}, i);  // 400 bytes
    push->Add(part);
  }
  ASSERT_TRUE(push->Finish().ok());
  EXPECT_EQ(fakes_[1]->push_calls(), 1);
  ASSERT_EQ(fakes_[1]->pushes().size(), 1u);
  EXPECT_EQ(fakes_[1]->pushes()[0].grads.size(), 3u);

  fakes_[1]->set_hold_pushes(true);
  push = client->StartPush(3, 4);
  auto big = std::make_shared<Params>();
  (*big)[KeyOnShard(1, "big")] = MakeParam({1000}, 1);  // 4000 bytes
  push->Add(big);
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (fakes_[1]->push_calls() < 2 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(fakes_[1]->push_calls(), 2);  // sent before Finish
  fakes_[1]->set_hold_pushes(false);
  ASSERT_TRUE(push->Finish().ok());
  EXPECT_EQ(fakes_[1]->pushes().size(), 2u);
}

// A push abandoned (its step failed mid-pass) sends nothing more: parts
// still held are dropped, so the shards see none of them.
TEST_F(GrpcPsClientTest, AnAbandonedPushSendsWhatItHeldNowhere) {
  GrpcClientOptions options = Options(/*worker=*/1);
  options.push_part_bytes = 4000;
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  std::unique_ptr<GradientPush> push = client->StartPush(2, 4);
  auto part = std::make_shared<Params>();
  (*part)[KeyOnShard(1, "small")] = MakeParam({100}, 1);  // under 4000 bytes
  push->Add(part);
  push->Abandon();
  push.reset();  // and the destructor sends nothing either
  EXPECT_EQ(fakes_[1]->push_calls(), 0);
  // A push dropped without Finish or Abandon is abandoned too.
  push = client->StartPush(3, 4);
  push->Add(part);
  push.reset();
  EXPECT_EQ(fakes_[1]->push_calls(), 0);
  // The client goes on: the next push is delivered.
  push = client->StartPush(4, 4);
  push->Add(part);
  ASSERT_TRUE(push->Finish().ok());
  EXPECT_EQ(fakes_[1]->push_calls(), 1);
}

TEST_F(GrpcPsClientTest, PullParametersReassemblesEveryShard) {
  std::map<std::string, Param> want;
  want[KeyOnShard(0, "a")] = MakeParam({2, 3}, 1);
  want[KeyOnShard(1, "b")] = MakeParam({5}, 2);
  want[KeyOnShard(1, "big")] = MakeParam({3, 1000, 1000}, 3);  // 3M floats
  want[KeyOnShard(0, "c")] = MakeParam({7, 1}, 4);
  for (const auto& [key, p] : want) {
    fakes_[proto::ShardForKey(key, kShards)]->SetParam(key, p);
  }
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::map<std::string, Param>> got = client->PullParameters(0);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), want.size());
  for (const auto& [key, p] : want) {
    ASSERT_EQ(got->count(key), 1u) << key;
    EXPECT_TRUE(SameParam(got->at(key), p)) << key;
  }

  const std::vector<std::string> keys = {KeyOnShard(1, "b"), KeyOnShard(0, "c"),
                                         KeyOnShard(1, "b")};
  got = client->PullParameters(keys, 0);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_TRUE(SameParam(got->at(keys[0]), want[keys[0]]));
  EXPECT_TRUE(SameParam(got->at(keys[1]), want[keys[1]]));

  EXPECT_EQ(client->PullParameters({"nope"}, 0).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(client->PullParameters(std::vector<std::string>{}, 0)->empty());

  // Into existing entries: the buffers are reused, the values replaced.
  std::map<std::string, Param> into;
  into[KeyOnShard(1, "big")] = MakeParam({3, 1000, 1000}, 9);
  into[KeyOnShard(0, "a")];
  const float* big_buffer = into[KeyOnShard(1, "big")].values.data();
  ASSERT_TRUE(client->PullParametersInto(0, &into).ok());
  ASSERT_EQ(into.size(), 2u);
  EXPECT_EQ(into[KeyOnShard(1, "big")].values.data(), big_buffer);
  EXPECT_TRUE(SameParam(into[KeyOnShard(1, "big")], want[KeyOnShard(1, "big")]));
  EXPECT_TRUE(SameParam(into[KeyOnShard(0, "a")], want[KeyOnShard(0, "a")]));
  into[KeyOnShard(0, "nope")];
  EXPECT_EQ(client->PullParametersInto(0, &into).code(),
            absl::StatusCode::kNotFound);
}

// The fake servers answer as servers that predate in_order: the pull
// still brings every key, into the caller's buffers (reused), each Wait
// returning once its key is in.
TEST_F(GrpcPsClientTest, StartPullFillsTheCallersEntries) {
  std::map<std::string, Param> want;
  want[KeyOnShard(1, "big")] = MakeParam({3, 1000, 1000}, 3);  // 3M floats
  want[KeyOnShard(0, "a")] = MakeParam({2, 3}, 1);
  want[KeyOnShard(1, "b")] = MakeParam({5}, 2);
  for (const auto& [key, p] : want) {
    fakes_[proto::ShardForKey(key, kShards)]->SetParam(key, p);
  }
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const std::vector<std::string> order = {
      KeyOnShard(1, "b"), KeyOnShard(0, "a"), KeyOnShard(1, "big")};
  std::map<std::string, Param> into;
  into[KeyOnShard(1, "big")] = MakeParam({3, 1000, 1000}, 9);
  into["stale"] = MakeParam({1}, 9);  // not asked for: dropped
  const float* big_buffer = into[KeyOnShard(1, "big")].values.data();
  std::unique_ptr<ParameterPull> pull = client->StartPull(0, order, &into);
  ASSERT_EQ(into.size(), 3u);
  for (const std::string& key : order) {
    ASSERT_TRUE(pull->Wait(key).ok()) << key;
    EXPECT_TRUE(SameParam(into[key], want[key])) << key;
  }
  ASSERT_TRUE(pull->Finish().ok());
  EXPECT_EQ(into[KeyOnShard(1, "big")].values.data(), big_buffer);

  pull = client->StartPull(0, {KeyOnShard(0, "a"), KeyOnShard(0, "nope")},
                           &into);
  EXPECT_EQ(pull->Wait(KeyOnShard(0, "nope")).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(pull->Finish().code(), absl::StatusCode::kNotFound);
}

// A streaming pull whose call fails after its first key is retried for the
// keys not yet in only: the entry a caller may already be reading is not
// written again.
TEST_F(GrpcPsClientTest, StartPullRetriesOnlyTheKeysNotYetIn) {
  const std::string a = KeyOnShard(0, "a"), b = KeyOnShard(0, "b"),
                    c = KeyOnShard(0, "c");
  fakes_[0]->SetParam(a, MakeParam({4}, 1));
  fakes_[0]->SetParam(b, MakeParam({5}, 2));
  fakes_[0]->SetParam(c, MakeParam({6}, 3));
  fakes_[0]->set_failing_pulls(1);
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  std::map<std::string, Param> into;
  std::unique_ptr<ParameterPull> pull = client->StartPull(3, {b, a, c}, &into);
  ASSERT_TRUE(pull->Wait(b).ok());
  const float* b_buffer = into[b].values.data();
  ASSERT_TRUE(pull->Finish().ok());
  EXPECT_TRUE(SameParam(into[a], MakeParam({4}, 1)));
  EXPECT_TRUE(SameParam(into[b], MakeParam({5}, 2)));
  EXPECT_TRUE(SameParam(into[c], MakeParam({6}, 3)));
  EXPECT_EQ(into[b].values.data(), b_buffer);
  const std::vector<proto::PullParametersRequest> calls =
      fakes_[0]->pull_requests();
  ASSERT_EQ(calls.size(), 2u);
  for (const proto::PullParametersRequest& r : calls) {
    EXPECT_TRUE(r.in_order());
    EXPECT_EQ(r.min_version(), 3);
  }
  EXPECT_EQ(std::vector<std::string>(calls[0].keys().begin(),
                                     calls[0].keys().end()),
            (std::vector<std::string>{b, a, c}));
  EXPECT_EQ(std::vector<std::string>(calls[1].keys().begin(),
                                     calls[1].keys().end()),
            (std::vector<std::string>{a, c}));
}

}  // namespace
}  // namespace bnps::client
