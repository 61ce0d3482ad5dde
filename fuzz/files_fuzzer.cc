// Fuzzes the files the binaries read by flag: arbitrary bytes go in as a
// job token file and as each of the PEM files for TLS. Errors are expected,
// crashes are not. (Each input is a file write and read: slower than the
// other targets.)

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "security/credentials.h"
#include "security/job_token.h"

namespace {

// Writes `bytes` to one scratch file per process and returns its path.
const std::string& Scratch(absl::string_view bytes) {
  // Removed when the process exits.
  struct File {
    std::string path;
    ~File() { unlink(path.c_str()); }
  };
  static const File file = [] {
    char name[] = "/dev/shm/bnps_fuzz_XXXXXX";
    const int fd = mkstemp(name);
    if (fd < 0) std::abort();
    close(fd);
    return File{name};
  }();
  const std::string& path = file.path;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
    std::abort();
  }
  std::fclose(f);
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  // Keeps gRPC initialized across inputs (each credentials object would
  // otherwise start it up and shut it down again).
  static const std::shared_ptr<grpc::ChannelCredentials> keep_grpc =
      grpc::InsecureChannelCredentials();
  const std::string& path = Scratch(bytes);
  bnps::security::ReadTokenFile(path).status().IgnoreError();
  bnps::security::TlsFiles as_ca{"", "", path};
  bnps::security::MakeChannelCredentials(as_ca).status().IgnoreError();
  bnps::security::TlsFiles as_pair{path, path, ""};
  bnps::security::MakeServerCredentials(as_pair).status().IgnoreError();
  // (A client's pair without a CA would load the system's root
  // certificates on every input: gRPC's work, not ours, and slow.)
  return 0;
}
