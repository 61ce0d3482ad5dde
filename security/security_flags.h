// The flags every client binary of a job takes to reach secured servers
// (bnps_worker, bnps_status): --token_file, --tls_ca, --tls_cert, --tls_key.
// Linking this library defines them; SecurityFromFlags reads them once the
// command line is parsed.
//
// Example:
//   util::ParseCommandLine(argc, argv, "usage ...");  // util/command_line.h
//   absl::StatusOr<ClientSecurity> security = SecurityFromFlags();
//   if (!security.ok()) ...  // a clear error naming the flag and file
//   options.credentials = security->credentials;
//   options.token = security->token;

#ifndef BNPS_SECURITY_SECURITY_FLAGS_H_
#define BNPS_SECURITY_SECURITY_FLAGS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"

namespace bnps::security {

struct ClientSecurity {
  // Plaintext unless --tls_ca or --tls_cert / --tls_key are given.
  // Null for plaintext (as GrpcClientOptions::credentials takes it).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Empty unless --token_file is given.
  std::string token;
};

// The credentials and token the flags ask for; INVALID_ARGUMENT or NOT_FOUND
// (naming the flag's file) if a file is missing or unusable.
absl::StatusOr<ClientSecurity> SecurityFromFlags();

}  // namespace bnps::security

#endif  // BNPS_SECURITY_SECURITY_FLAGS_H_
