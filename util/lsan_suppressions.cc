// LeakSanitizer's default suppressions for the binaries (read only in
// --config=asan builds; elsewhere nothing calls it).
//
// c-ares, the DNS resolver gRPC uses for host names such as "localhost" or
// "bnps-server-0.bnps-server", keeps a 10-byte allocation for the process's
// lifetime (reported as a direct leak from libcares.so.2 at exit). It is the
// library's, not ours, and nothing grows with it.
//
// oneDNN (Debian's libdnnl.so.2) keeps per-thread state (a 56-byte block and
// its buffers) that it does not free when a thread that ran a primitive
// exits: each replica thread of `bnps_worker --replicas` leaves one at exit,
// once per thread (the threads live for the whole run), never per step.

extern "C" const char* __lsan_default_suppressions() {
  return "leak:libcares.so\nleak:libdnnl.so\n";
}
