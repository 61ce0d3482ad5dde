#include "server/write_queue.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace bnps::server {
namespace {

grpc::ByteBuffer Message(const std::string& text) {
  grpc::Slice slice(text);
  return grpc::ByteBuffer(&slice, 1);
}

std::string Text(const grpc::ByteBuffer* m) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(m->Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

TEST(WriteQueue, WritesOneAtATimeInOrder) {
  WriteQueue queue;
  const grpc::ByteBuffer* start = queue.Push(Message("a"));
  ASSERT_NE(start, nullptr);
  EXPECT_EQ(Text(start), "a");
  EXPECT_TRUE(queue.writing());
  EXPECT_EQ(queue.Push(Message("b")), nullptr);  // "a" is in flight
  EXPECT_EQ(queue.Push(Message("c")), nullptr);
  EXPECT_EQ(Text(queue.WriteDone(true)), "b");
  EXPECT_EQ(Text(queue.WriteDone(true)), "c");
  EXPECT_EQ(queue.WriteDone(true), nullptr);
  EXPECT_FALSE(queue.writing());
  EXPECT_FALSE(queue.broken());
  // Idle again: the next message is written at once.
  EXPECT_EQ(Text(queue.Push(Message("d"))), "d");
}

TEST(WriteQueue, AFailedWriteBreaksItAndGivesTheBudgetBack) {
  auto budget = std::make_shared<util::ByteBudget>(100);
  WriteQueue queue(50, budget);
  ASSERT_NE(queue.Push(Message("0123456789")), nullptr);
  EXPECT_EQ(queue.Push(Message("0123456789")), nullptr);
  EXPECT_EQ(budget->used(), 20);
  EXPECT_EQ(queue.WriteDone(false), nullptr);  // the client went away
  EXPECT_TRUE(queue.broken());
  EXPECT_FALSE(queue.writing());
  EXPECT_EQ(queue.held(), 0);
  EXPECT_EQ(budget->used(), 0);
  EXPECT_EQ(queue.Push(Message("more")), nullptr);  // takes no more
  EXPECT_EQ(budget->used(), 0);
}

TEST(WriteQueue, PastItsCapItBreaksKeepingTheWriteInFlight) {
  auto budget = std::make_shared<util::ByteBudget>(1000);
  WriteQueue queue(25, budget);
  ASSERT_NE(queue.Push(Message("0123456789")), nullptr);
  int64_t cut_at = -1;
  EXPECT_EQ(queue.Push(Message("0123456789"), &cut_at), nullptr);
  EXPECT_EQ(cut_at, -1);  // 20 bytes: within the cap
  EXPECT_EQ(queue.Push(Message("0123456789"), &cut_at), nullptr);
  EXPECT_EQ(cut_at, 30);
  EXPECT_TRUE(queue.broken());
  // The message being written stays (gRPC reads it) until its write ends.
  EXPECT_TRUE(queue.writing());
  EXPECT_EQ(queue.held(), 10);
  EXPECT_EQ(budget->used(), 10);
  EXPECT_EQ(queue.WriteDone(true), nullptr);
  EXPECT_EQ(budget->used(), 0);
}

TEST(WriteQueue, PastTheSharedBudgetItBreaks) {
  auto budget = std::make_shared<util::ByteBudget>(15);
  WriteQueue first(100, budget);
  WriteQueue second(100, budget);
  ASSERT_NE(first.Push(Message("0123456789")), nullptr);
  int64_t cut_at = -1;
  EXPECT_EQ(second.Push(Message("0123456789"), &cut_at), nullptr);
  EXPECT_EQ(cut_at, 10);
  EXPECT_TRUE(second.broken());
  EXPECT_FALSE(first.broken());
  EXPECT_EQ(budget->used(), 10);
}

TEST(WriteQueue, CloseAndDestructionGiveEverythingBack) {
  auto budget = std::make_shared<util::ByteBudget>(100);
  {
    WriteQueue queue(100, budget);
    ASSERT_NE(queue.Push(Message("0123456789")), nullptr);
    EXPECT_EQ(queue.Push(Message("0123456789")), nullptr);
    queue.Close();
    EXPECT_EQ(budget->used(), 0);
    EXPECT_EQ(queue.held(), 0);
    ASSERT_NE(queue.Push(Message("abc")), nullptr);
    EXPECT_EQ(budget->used(), 3);
  }
  EXPECT_EQ(budget->used(), 0);
}

}  // namespace
}  // namespace bnps::server
