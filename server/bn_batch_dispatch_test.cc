// BnBatchDispatcher without a network: a batch is answered once, with its
// entries' answers in order, equal to the same requests dispatched one by
// one; entries and batches it may not take are refused.

#include "server/bn_batch_dispatch.h"

#include <memory>
#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "proto/codec.h"
#include "server/shard.h"

namespace bnps::server {
namespace {

std::unique_ptr<Shard> MakeShard(int workers) {
  ShardOptions o;
  o.num_workers = workers;
  auto shard = Shard::Create(o);
  EXPECT_TRUE(shard.ok()) << shard.status();
  for (int w = 0; w < workers; ++w) {
    EXPECT_TRUE((*shard)->Register(w, /*incarnation=*/100 + w).ok());
  }
  return *std::move(shard);
}

proto::BnRequest Forward(int worker, uint64_t id) {
  bn::Moments m;
  m.count = 3 + worker;
  m.mean = {1e8 + 0.1 * worker, -2.5 * worker};
  m.m2 = {1.0 / 3 + worker, 2.0};
  proto::BnRequest r;
  r.set_id(id);
  r.set_job("bnps");
  r.set_worker(worker);
  r.set_layer("bn1");
  r.set_phase(proto::BN_FORWARD);
  proto::EncodeMoments(m, r.mutable_moments());
  return r;
}

TEST(BnBatchDispatcherTest, ABatchIsAnsweredOnceAsItsEntriesOneByOne) {
  // One by one, on a shard of its own.
  std::unique_ptr<Shard> flat = MakeShard(2);
  std::vector<proto::BnResponse> single(2);
  for (int w : {1, 0}) {
    BnDispatcher d(flat.get(), nullptr, 0, w);
    d.Dispatch(Forward(w, 10 + w), [&single, w](const proto::BnResponse& r) {
      single[w] = r;
    });
  }
  // As one batch.
  std::unique_ptr<Shard> shard = MakeShard(2);
  BnBatchDispatcher d(shard.get(), nullptr, 0, {0, 1});
  proto::BnRequest batch;
  batch.set_id(7);
  *batch.add_batch() = Forward(0, 10);
  *batch.add_batch() = Forward(1, 11);
  int calls = 0;
  proto::BnResponse whole;
  d.Dispatch(batch, [&](const proto::BnResponse& r) {
    ++calls;
    whole = r;
  });
  ASSERT_EQ(calls, 1);
  EXPECT_EQ(whole.id(), 7u);
  EXPECT_EQ(whole.code(), 0) << whole.message();
  ASSERT_EQ(whole.batch_size(), 2);
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(whole.batch(w).SerializeAsString(), single[w].SerializeAsString());
    EXPECT_EQ(whole.batch(w).contributors(), 2);
  }
}

TEST(BnBatchDispatcherTest, WhatItMayNotTakeIsRefused) {
  std::unique_ptr<Shard> shard = MakeShard(3);
  BnBatchDispatcher d(shard.get(), nullptr, 0, {0, 1});
  std::optional<proto::BnResponse> got;
  auto keep = [&got](const proto::BnResponse& r) { got = r; };
  // A plain request of a worker it does not speak for.
  d.Dispatch(Forward(2, 1), keep);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  // More entries than workers: the whole is refused.
  proto::BnRequest batch;
  batch.set_id(2);
  for (int w : {0, 1, 1}) *batch.add_batch() = Forward(w, 20 + w);
  got.reset();
  d.Dispatch(batch, keep);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(got->batch_size(), 0);
  // A nested batch and another worker's entry: refused entry by entry.
  batch.Clear();
  batch.set_id(3);
  proto::BnRequest* nested = batch.add_batch();
  nested->set_id(30);
  *nested->add_batch() = Forward(0, 31);
  *batch.add_batch() = Forward(2, 32);
  got.reset();
  d.Dispatch(batch, keep);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->code(), 0);
  ASSERT_EQ(got->batch_size(), 2);
  EXPECT_EQ(got->batch(0).code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(got->batch(1).code(),
            static_cast<int>(absl::StatusCode::kPermissionDenied));
}

}  // namespace
}  // namespace bnps::server
