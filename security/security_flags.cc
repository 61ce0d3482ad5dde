#include "security/security_flags.h"

#include "absl/flags/flag.h"
#include "security/credentials.h"
#include "security/job_token.h"

ABSL_FLAG(std::string, token_file, "",
          "File holding the job's token (16 to 4096 printable characters, no "
          "spaces), for servers started with --token_file: every call "
          "proves it (without TLS, the token itself is never sent). Use "
          "with TLS outside a trusted network.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the CA certificates the servers' certificates must "
          "chain to: connect with TLS. Without it (and without --tls_cert), "
          "calls are plaintext.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain this client presents, for servers started "
          "with --tls_client_ca (mutual TLS); needs --tls_key.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");

namespace bnps::security {

absl::StatusOr<ClientSecurity> SecurityFromFlags() {
  ClientSecurity out;
  security::TlsFiles files;
  files.ca = absl::GetFlag(FLAGS_tls_ca);
  files.cert = absl::GetFlag(FLAGS_tls_cert);
  files.key = absl::GetFlag(FLAGS_tls_key);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      security::MakeChannelCredentials(files);
  if (!credentials.ok()) return credentials.status();
  if (security::UsesTls(files)) out.credentials = *std::move(credentials);
  const std::string token_file = absl::GetFlag(FLAGS_token_file);
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = security::ReadTokenFile(token_file);
    if (!token.ok()) return token.status();
    out.token = *std::move(token);
  }
  return out;
}

}  // namespace bnps::security
