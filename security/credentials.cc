#include "security/credentials.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpc/grpc_security_constants.h"
#include "security/small_file.h"

namespace bnps::security {
namespace {

// What each file is for, as error messages name it.
constexpr absl::string_view kCertWhat = "TLS certificate";
constexpr absl::string_view kKeyWhat = "TLS key";
constexpr absl::string_view kCaWhat = "TLS CA";
// Far more than any certificate chain or key.
constexpr size_t kMaxPemBytes = size_t{1} << 20;

// The whole of the PEM file at `path`; `what` names its role in errors.
absl::StatusOr<std::string> ReadPem(absl::string_view what,
                                    const std::string& path) {
  absl::StatusOr<std::string> contents =
      ReadSmallFile(what, path, kMaxPemBytes);
  if (!contents.ok()) return contents.status();
  if (!absl::StrContains(*contents, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", path, "' is not PEM (no \"-----BEGIN \" line)"));
  }
  return contents;
}

// INVALID_ARGUMENT unless cert and key are both set or both empty.
absl::Status CheckCertKeyPair(const TlsFiles& files) {
  if (!files.cert.empty() && files.key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kCertWhat, " '", files.cert, "' given without a ", kKeyWhat));
  }
  if (files.cert.empty() && !files.key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kKeyWhat, " '", files.key, "' given without a ", kCertWhat));
  }
  return absl::OkStatus();
}

// The PEM contents of every path set in `files`; empty strings for the rest.
absl::StatusOr<TlsFiles> ReadAll(const TlsFiles& files) {
  struct Part {
    absl::string_view what;
    const std::string* path;
    std::string* contents;
  };
  TlsFiles pem;
  for (const Part& part : {Part{kCertWhat, &files.cert, &pem.cert},
                           Part{kKeyWhat, &files.key, &pem.key},
                           Part{kCaWhat, &files.ca, &pem.ca}}) {
    if (part.path->empty()) continue;
    absl::StatusOr<std::string> contents = ReadPem(part.what, *part.path);
    if (!contents.ok()) return contents.status();
    *part.contents = *std::move(contents);
  }
  return pem;
}

}  // namespace

bool UsesTls(const TlsFiles& files) {
  return !files.cert.empty() || !files.key.empty() || !files.ca.empty();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files) {
  if (!UsesTls(files)) return grpc::InsecureServerCredentials();
  if (absl::Status s = CheckCertKeyPair(files); !s.ok()) return s;
  if (files.cert.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kCaWhat, " '", files.ca, "' given without a ", kCertWhat,
                     " and ", kKeyWhat, " for the server"));
  }
  absl::StatusOr<TlsFiles> pem = ReadAll(files);
  if (!pem.ok()) return pem.status();

  grpc::SslServerCredentialsOptions options(
      pem->ca.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = std::move(pem->ca);
  options.pem_key_cert_pairs.push_back(
      {std::move(pem->key), std::move(pem->cert)});
  std::shared_ptr<grpc::ServerCredentials> creds =
      grpc::SslServerCredentials(options);
  if (creds == nullptr) {
    return absl::InternalError("gRPC refused the server's TLS credentials");
  }
  return creds;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const TlsFiles& files) {
  if (!UsesTls(files)) return grpc::InsecureChannelCredentials();
  if (absl::Status s = CheckCertKeyPair(files); !s.ok()) return s;
  absl::StatusOr<TlsFiles> pem = ReadAll(files);
  if (!pem.ok()) return pem.status();

  grpc::SslCredentialsOptions options;
  options.pem_root_certs = std::move(pem->ca);  // empty: system roots
  options.pem_private_key = std::move(pem->key);
  options.pem_cert_chain = std::move(pem->cert);
  std::shared_ptr<grpc::ChannelCredentials> creds =
      grpc::SslCredentials(options);
  if (creds == nullptr) {
    return absl::InternalError("gRPC refused the client's TLS credentials");
  }
  return creds;
}

}  // namespace bnps::security
