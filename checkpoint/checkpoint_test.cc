#include "checkpoint/checkpoint.h"

#include <signal.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace bnps::checkpoint {
namespace {

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ckpt_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = std::string(tmpl) + "/ckpt";  // Write creates it
  }
  void TearDown() override {
    std::system(("rm -rf " + dir_.substr(0, dir_.rfind('/'))).c_str());
  }
  std::string ReadAll(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  void WriteAll(const std::string& path, const std::string& data) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << data;
  }
  std::string dir_;
};

TEST_F(CheckpointTest, RoundTripsAndKeepsTheNewest) {
  for (int64_t step : {2, 4, 6, 8}) {
    ASSERT_TRUE(WriteCheckpoint(dir_, step, "payload " + std::to_string(step)).ok());
  }
  absl::StatusOr<std::vector<int64_t>> steps = ListCheckpoints(dir_);
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, (std::vector<int64_t>{8, 6, 4}));  // kKeepCheckpoints
  absl::StatusOr<CheckpointFile> f = LoadNewestCheckpoint(dir_);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->step, 8);
  EXPECT_EQ(f->payload, "payload 8");
  // No temporary file is left behind.
  EXPECT_NE(access((CheckpointPath(dir_, 8) + ".tmp").c_str(), F_OK), 0);
}

// A write that fails part-way (here the file size limit, EFBIG, as a full
// disk gives ENOSPC) says so, leaves no temporary file and removes nothing:
// the previous checkpoints stay the newest good ones.
TEST_F(CheckpointTest, AFailedWriteKeepsThePreviousFiles) {
  for (int64_t step : {2, 4, 6}) {
    ASSERT_TRUE(WriteCheckpoint(dir_, step, "payload " + std::to_string(step)).ok());
  }
  struct rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 64 << 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const absl::Status s = WriteCheckpoint(dir_, 8, std::string(1 << 20, 'x'));
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(absl::IsInternal(s)) << s;
  EXPECT_EQ(*ListCheckpoints(dir_), (std::vector<int64_t>{6, 4, 2}));
  EXPECT_NE(access((CheckpointPath(dir_, 8) + ".tmp").c_str(), F_OK), 0);
  absl::StatusOr<CheckpointFile> f = LoadNewestCheckpoint(dir_);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->payload, "payload 6");
}

TEST_F(CheckpointTest, EmptyPayloadAndAbsentDirectory) {
  absl::StatusOr<CheckpointFile> none = LoadNewestCheckpoint(dir_);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(WriteCheckpoint(dir_, 0, "").ok());
  absl::StatusOr<CheckpointFile> f = ReadCheckpoint(CheckpointPath(dir_, 0));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->payload, "");
}

TEST_F(CheckpointTest, BadChecksumFallsBackToThePrevious) {
  ASSERT_TRUE(WriteCheckpoint(dir_, 1, "first state").ok());
  ASSERT_TRUE(WriteCheckpoint(dir_, 2, "second state").ok());
  const std::string path = CheckpointPath(dir_, 2);
  std::string data = ReadAll(path);
  data[data.size() - 3] ^= 0x01;  // one bit of the payload
  WriteAll(path, data);
  absl::StatusOr<CheckpointFile> bad = ReadCheckpoint(path);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("checksum"), std::string::npos);

  testing::internal::CaptureStderr();
  absl::StatusOr<CheckpointFile> f = LoadNewestCheckpoint(dir_, "test");
  const std::string log = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->step, 1);
  EXPECT_EQ(f->payload, "first state");
  EXPECT_NE(log.find(path), std::string::npos) << log;
  EXPECT_NE(log.find("checksum mismatch"), std::string::npos) << log;
  // Set aside: no longer listed, kept for a post-mortem.
  EXPECT_EQ(*ListCheckpoints(dir_), (std::vector<int64_t>{1}));
  EXPECT_EQ(access((path + ".bad").c_str(), F_OK), 0);
}

TEST_F(CheckpointTest, TornFilesAreDetected) {
  ASSERT_TRUE(WriteCheckpoint(dir_, 3, "older").ok());
  ASSERT_TRUE(WriteCheckpoint(dir_, 5, std::string(1000, 'x')).ok());
  const std::string path = CheckpointPath(dir_, 5);
  const std::string data = ReadAll(path);
  for (size_t cut : {size_t{0}, size_t{10}, data.size() - 1}) {
    WriteAll(path, data.substr(0, cut));
    absl::StatusOr<CheckpointFile> bad = ReadCheckpoint(path);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << cut;
    EXPECT_NE(bad.status().message().find("torn"), std::string::npos)
        << bad.status();
    testing::internal::CaptureStderr();
    absl::StatusOr<CheckpointFile> f = LoadNewestCheckpoint(dir_);
    testing::internal::GetCapturedStderr();
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f->step, 3);
  }
}

TEST_F(CheckpointTest, ForeignFileAndWrongStepAreRefused) {
  ASSERT_TRUE(WriteCheckpoint(dir_, 1, "good").ok());
  WriteAll(CheckpointPath(dir_, 7), "definitely not a checkpoint, long enough");
  absl::StatusOr<CheckpointFile> bad = ReadCheckpoint(CheckpointPath(dir_, 7));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("magic"), std::string::npos);
  // A good file renamed to another step's name is not taken for that step.
  ASSERT_TRUE(WriteCheckpoint(dir_, 2, "two").ok());
  ASSERT_EQ(std::rename(CheckpointPath(dir_, 2).c_str(),
                        CheckpointPath(dir_, 9).c_str()),
            0);
  testing::internal::CaptureStderr();
  absl::StatusOr<CheckpointFile> f = LoadNewestCheckpoint(dir_);
  testing::internal::GetCapturedStderr();
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->step, 1);
  // Every file bad: NOT_FOUND.
  WriteAll(CheckpointPath(dir_, 1), "x");
  testing::internal::CaptureStderr();
  EXPECT_EQ(LoadNewestCheckpoint(dir_).status().code(),
            absl::StatusCode::kNotFound);
  testing::internal::GetCapturedStderr();
}

TEST_F(CheckpointTest, PiecesAreOnePayload) {
  const std::string big(3 << 20, 'x');  // more than VerifyCheckpoint's buffer
  ASSERT_TRUE(WriteCheckpoint(dir_, 3, {"head:", big, ":tail"}).ok());
  absl::StatusOr<CheckpointFile> f = ReadCheckpoint(CheckpointPath(dir_, 3));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->payload, "head:" + big + ":tail");
  EXPECT_TRUE(VerifyCheckpoint(CheckpointPath(dir_, 3)).ok());
}

TEST_F(CheckpointTest, VerifyFindsWhatReadFinds) {
  ASSERT_TRUE(WriteCheckpoint(dir_, 1, std::string(5000, 'a')).ok());
  const std::string path = CheckpointPath(dir_, 1);
  std::string data = ReadAll(path);
  data[data.size() - 10] = 'b';
  WriteAll(path, data);
  EXPECT_EQ(VerifyCheckpoint(path).code(), absl::StatusCode::kDataLoss);
  WriteAll(path, data.substr(0, data.size() - 1));
  const absl::Status torn = VerifyCheckpoint(path);
  EXPECT_EQ(torn.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(torn.message().find("torn"), std::string::npos) << torn;
  WriteAll(path, "short");
  EXPECT_EQ(VerifyCheckpoint(path).code(), absl::StatusCode::kDataLoss);
}

TEST_F(CheckpointTest, FilesArePrivate) {
  ASSERT_TRUE(WriteCheckpoint(dir_, 1, "secret state").ok());
  struct stat st;
  ASSERT_EQ(::stat(CheckpointPath(dir_, 1).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST_F(CheckpointTest, OneWriterPerDirectoryAndStaleTemporariesGo) {
  ASSERT_TRUE(CreateCheckpointDir(dir_).ok());
  const std::string stale = CheckpointPath(dir_, 9) + ".tmp";
  WriteAll(stale, "half a checkpoint");
  absl::StatusOr<std::unique_ptr<DirLock>> first = LockCheckpointDir(dir_);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_NE(::access(stale.c_str(), F_OK), 0) << "the stale .tmp file stayed";
  absl::StatusOr<std::unique_ptr<DirLock>> second = LockCheckpointDir(dir_);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("in use by another server (pid " +
                                           std::to_string(::getpid())),
            std::string::npos)
      << second.status();
  first->reset();  // released: the next server may take it
  EXPECT_TRUE(LockCheckpointDir(dir_).ok());
}

TEST_F(CheckpointTest, BadArguments) {
  EXPECT_EQ(WriteCheckpoint("", 1, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteCheckpoint(dir_, -1, "x").code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace bnps::checkpoint
