// Blocking pipe I/O for ps_benchmark's child processes: the worker pool's
// jobs and results, and a grad child's output. A read gives up at a
// deadline; EINTR is retried.
//
// Thread-safety: plain functions; callers own the descriptors.

#ifndef BNPS_BENCH_PIPE_IO_H_
#define BNPS_BENCH_PIPE_IO_H_

#include <sys/types.h>

#include <cstddef>

#include "absl/time/time.h"

namespace bnps::bench {

// One read(2) of at most `n` bytes from `fd` once it is readable: the bytes
// read, 0 at the end of the pipe, -1 on an error or once `deadline` passed.
ssize_t ReadSome(int fd, void* data, size_t n, absl::Time deadline);

// Reads or writes all `n` bytes unless the pipe ends, fails or `deadline`
// passes first. True if all were moved.
bool ReadFull(int fd, void* data, size_t n, absl::Time deadline);
bool WriteFull(int fd, const void* data, size_t n);

}  // namespace bnps::bench

#endif  // BNPS_BENCH_PIPE_IO_H_
