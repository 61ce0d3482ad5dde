// Function multiversioning for hot loops. The loader picks the widest version
// the CPU has.
//
// BNPS_CPU_CLONES: put before a hot loop's function definition to compile it
// for AVX-512, AVX2 and baseline x86-64. The build targets baseline x86-64
// (SSE2) so the binaries run on any x86-64, and there the loops that check or
// update whole tensors do a quarter of the work per instruction that AVX-512
// does. Every version must give the same results: use it on integer code, or
// on floating-point code compiled with -ffp-contract=off (no fused
// multiply-add).
//
// BNPS_HOT_LOOP: versions for x86-64-v3 (AVX2, FMA) and baseline x86-64; the
// BN kernels (bn/cpu_kernels.cc) and the CPU backend's pooling use it. These
// versions may round differently in the last bits (fused multiply-add, the
// width of a vectorized reduction), so results are reproducible on one kind
// of CPU, not across kinds.
//
// Elsewhere (another compiler or CPU) both are empty.
//
// Example:
//   BNPS_CPU_CLONES
//   size_t CountZeros(absl::Span<const float> v) { ... }

#ifndef BNPS_UTIL_CPU_CLONES_H_
#define BNPS_UTIL_CPU_CLONES_H_

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define BNPS_CPU_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default")))
#define BNPS_HOT_LOOP \
  __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define BNPS_CPU_CLONES
#define BNPS_HOT_LOOP
#endif

#endif  // BNPS_UTIL_CPU_CLONES_H_
