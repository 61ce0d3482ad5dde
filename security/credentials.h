// gRPC credentials from PEM files, so that servers and workers can talk over
// TLS or mutual TLS instead of plaintext. A binary fills a TlsFiles from its
// flags and hands the result to ServerBuilder::AddListeningPort or
// grpc::CreateCustomChannel; with no path set both sides stay plaintext.
//
// Example (a server that accepts only workers holding a certificate from
// ca.pem, and a worker that dials it):
//
//   TlsFiles server_files{"server.pem", "server.key", "ca.pem"};
//   absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> server_creds =
//       MakeServerCredentials(server_files);
//   if (!server_creds.ok()) return server_creds.status();
//   builder.AddListeningPort("0.0.0.0:50051", *server_creds, &port);
//
//   TlsFiles worker_files{"client.pem", "client.key", "ca.pem"};
//   absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> channel_creds =
//       MakeChannelCredentials(worker_files);
//   if (!channel_creds.ok()) return channel_creds.status();
//   auto channel =
//       grpc::CreateCustomChannel("ps0:50051", *channel_creds, args);
//
// The files are read once, when the credentials are made: replacing them on
// disk takes effect only for credentials made afterwards. Here a file is only
// checked to be readable and to look like PEM; gRPC parses it later. A bad
// certificate, or a key that does not match it, shows only then and only in
// gRPC's log: the server's BuildAndStart returns null, and every call on the
// client's channel fails UNAVAILABLE ("empty address list").
//
// The client checks that the server's certificate names the host it dials
// (subjectAltName); the server accepts any client certificate that chains to
// `ca`, whoever it names. A refused handshake reaches the client as
// UNAVAILABLE; when the server refused the client's certificate the client
// sees only "Socket closed", and the reason is in the server's log.
//
// Thread-safety: the functions keep no state and may be called concurrently.

#ifndef BNPS_SECURITY_CREDENTIALS_H_
#define BNPS_SECURITY_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace bnps::security {

// PEM files for TLS; an empty path means "not used".
struct TlsFiles {
  std::string cert;  // this side's certificate chain
  std::string key;   // its private key
  std::string ca;    // CA certificates the peer's certificate must chain to
};

// True if any path is set.
bool UsesTls(const TlsFiles& files);

// Server side. No path set: plaintext (grpc::InsecureServerCredentials()).
// cert and key: TLS, no client certificate asked for. ca as well: mutual
// TLS -- a client must present a certificate that chains to ca.
//
// Errors:
//   INVALID_ARGUMENT  cert without key, key without cert, or ca without cert
//                     and key; a file with no "-----BEGIN " in it.
//   NOT_FOUND         a file that cannot be read; the message names the path,
//                     what it was for and why ("TLS key 'x.key': cannot read:
//                     No such file or directory").
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files);

// Client side. No path set: plaintext (grpc::InsecureChannelCredentials()).
// ca: TLS, the server's certificate must chain to ca. cert and key as well:
// the client presents them (mutual TLS). cert and key without ca: TLS with
// the system's root certificates.
//
// Errors: as MakeServerCredentials, except that ca alone is valid.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const TlsFiles& files);

}  // namespace bnps::security

#endif  // BNPS_SECURITY_CREDENTIALS_H_
