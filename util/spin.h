// Busy-wait helpers: what every polling loop (the BN listener's, a BN
// call's, KeepAwake's) does between two looks.

#ifndef BNPS_UTIL_SPIN_H_
#define BNPS_UTIL_SPIN_H_

#include <sched.h>

namespace bnps::util {

// Tells the CPU this is a spin-wait: on x86 it yields the core's resources to
// a hyperthread sibling and saves power.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The pause after the `n`th look (counting from 0) of a polling loop that
// must not hold back other work: the CPU relaxes, and every 16th time any
// other thread ready on this CPU runs first (a server's thread, where a
// worker polls on a CPU it turns out to share). Yielding at every look
// would add a system call to the time the loop takes to notice its event.
inline void PollPause(unsigned n) {
  CpuRelax();
  if ((n & 15) == 15) sched_yield();
}

}  // namespace bnps::util

#endif  // BNPS_UTIL_SPIN_H_
