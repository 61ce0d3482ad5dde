#include "util/fd_limit.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace bnps::util {
namespace {

// A server must run with its hard descriptor limit, not the
// shell's soft default. The limit is process-wide, so the check runs in a
// child process that lowers its soft limit first.
TEST(FdLimitTest, RaisesTheSoftLimitToTheHardOne) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    rlimit r{};
    if (getrlimit(RLIMIT_NOFILE, &r) != 0) _exit(10);
    if (r.rlim_max < 128) _exit(0);  // nothing to lower: vacuously fine
    r.rlim_cur = 64;
    if (setrlimit(RLIMIT_NOFILE, &r) != 0) _exit(11);
    if (OpenFileLimit() != 64) _exit(12);
    absl::StatusOr<int64_t> raised = RaiseOpenFileLimit();
    if (!raised.ok()) _exit(13);
    rlimit now{};
    getrlimit(RLIMIT_NOFILE, &now);
    if (now.rlim_cur != r.rlim_max) _exit(14);
    if (*raised != OpenFileLimit() || *raised <= 64) _exit(15);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace bnps::util
