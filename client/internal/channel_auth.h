// How the calls on one channel to a shard prove the job's token, the one
// place every client call goes through (Channels, JobReader, the BN
// stream):
//   - no token: nothing;
//   - a token over TLS: the token in each call's metadata, as ever (TLS
//     keeps it from the network);
//   - a token without TLS: a session (security/call_session.h), opened on
//     the channel's first call (the Session rpc); an interceptor on the
//     channel signs every call as it leaves (its method and generation
//     metadata included), so no call site handles a MAC. A call refused
//     with UNAUTHENTICATED under a session (a restarted server forgot it)
//     drops the session: Run then opens another and makes the call once
//     more.
// The token itself never crosses the wire without TLS.
//
// Example:
//   ChannelAuth auth({"job", /*worker=*/2, token, /*tls=*/false}, "shard 0");
//   std::shared_ptr<grpc::Channel> channel =
//       auth.Connect("h:7000", grpc::InsecureChannelCredentials(), args);
//   absl::Status s = auth.Run(deadline, set_deadline,
//                             [&](grpc::ClientContext& c) { ...call... });
//
// Thread-safety: thread-safe. Internal to client/.

#ifndef BNPS_CLIENT_INTERNAL_CHANNEL_AUTH_H_
#define BNPS_CLIENT_INTERNAL_CHANNEL_AUTH_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "security/call_session.h"

namespace bnps::client::internal {

class ChannelAuth {
 public:
  struct Identity {
    std::string job;
    int worker = -1;    // -1: no worker (a tool reading the job)
    std::string token;  // the job's or the worker's own; empty: none
    bool tls = false;   // whether the channel's credentials are TLS
    // The Session calls wait for a server that cannot be reached yet.
    bool wait_for_ready = false;
  };

  // `where` names the server in errors ("shard 0 (h:7000)").
  ChannelAuth(Identity identity, std::string where);

  // The channel to `target` whose calls this authenticates. Call once;
  // this must outlive the calls started before it is destroyed (the
  // channel's interceptor holds only the session, not this).
  std::shared_ptr<grpc::Channel> Connect(
      const std::string& target,
      const std::shared_ptr<grpc::ChannelCredentials>& credentials,
      const grpc::ChannelArguments& args) ABSL_LOCKS_EXCLUDED(mu_);

  // Readies a call's context (deadline and other metadata set): the token
  // under TLS; a session without TLS, opened first if there is none
  // (waiting at most until `deadline`: the status of the Session rpc, or
  // UNAUTHENTICATED from a server that cannot prove it holds the key).
  // `*session`: the session the call runs under (0: none), for Forget.
  absl::Status Prepare(grpc::ClientContext* context, absl::Time deadline,
                       uint64_t* session) ABSL_LOCKS_EXCLUDED(mu_, open_mu_);

  // Prepare without a context: opens a session if sessions are used and
  // none is open. For a call set up by hand (the BN stream, its token from
  // MetadataToken).
  absl::Status Ensure(absl::Time deadline, uint64_t* session)
      ABSL_LOCKS_EXCLUDED(mu_, open_mu_);

  // After a call under `session` ended with `s`: true if it should be made
  // once more because the server refused the session (UNAUTHENTICATED);
  // the session is dropped, so the next Prepare opens another.
  bool Forget(uint64_t session, const absl::Status& s) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs attempt(context) on a fresh context set up by setup(&context)
  // (deadline, metadata) and Prepare; once more after Forget.
  template <typename SetUp, typename Attempt>
  absl::Status Run(absl::Time deadline, SetUp setup, Attempt attempt);

  // The token calls carry in their metadata: the token under TLS, else
  // empty (for a call set up by hand, as the BN stream is).
  std::string MetadataToken() const {
    return identity_.tls ? identity_.token : std::string();
  }
  // Whether calls run under sessions (a token, no TLS).
  bool uses_sessions() const {
    return !identity_.token.empty() && !identity_.tls;
  }

  // What the channel's interceptor signs with; shared with it.
  struct Current {
    absl::Mutex mu;
    std::shared_ptr<security::ClientSession> session ABSL_GUARDED_BY(mu);
  };

 private:
  // Opens a session (the two Session calls) on channel_.
  absl::StatusOr<std::shared_ptr<security::ClientSession>> Open(
      absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(open_mu_);

  const Identity identity_;
  const std::string where_;
  const std::shared_ptr<Current> current_ = std::make_shared<Current>();
  // Held while a session is opened: one opening at a time.
  absl::Mutex open_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(mu_);
};

template <typename SetUp, typename Attempt>
absl::Status ChannelAuth::Run(absl::Time deadline, SetUp setup,
                              Attempt attempt) {
  for (int i = 0;; ++i) {
    grpc::ClientContext context;
    setup(&context);
    uint64_t session = 0;
    absl::Status s = Prepare(&context, deadline, &session);
    if (s.ok()) s = attempt(context);
    if (i > 0 || !Forget(session, s)) return s;
  }
}

}  // namespace bnps::client::internal

#endif  // BNPS_CLIENT_INTERNAL_CHANNEL_AUTH_H_
