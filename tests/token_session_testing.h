// For tests that make raw gRPC calls "as" a token (the job's, a worker's
// own, a wrong one) without TLS: a channel on which a call carrying the
// token in its metadata (security::kTokenMetadataKey, as the tests set it)
// goes out under a session of that token instead (security/call_session.h),
// as the client library's calls do. The token is taken off the call; a
// token that cannot open a session (wrong, or none of the job's) leaves the
// call with neither, for the server to refuse. Each token's session is
// opened once, on a channel of its own, speaking for the first worker whose
// session the server proves (-1, the job token's, first).

#ifndef BNPS_TESTS_TOKEN_SESSION_TESTING_H_
#define BNPS_TESTS_TOKEN_SESSION_TESTING_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/client_interceptor.h"
#include "proto/bnps.grpc.pb.h"
#include "proto/generation.h"
#include "security/call_session.h"
#include "security/job_token.h"

namespace bnps::testing {

class TokenSessions {
 public:
  TokenSessions(const std::string& target, int num_workers)
      : stub_(proto::ParameterServer::NewStub(
            grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))),
        num_workers_(num_workers) {}

  // `token`'s session; null if none opens.
  std::shared_ptr<security::ClientSession> For(const std::string& token) {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(token);
    if (it != sessions_.end()) return it->second;
    std::shared_ptr<security::ClientSession> s;
    for (int w = -1; w < num_workers_ && s == nullptr; ++w) s = Open(token, w);
    sessions_[token] = s;
    return s;
  }

 private:
  std::shared_ptr<security::ClientSession> Open(const std::string& token,
                                                int worker) {
    security::SessionOpener opener("bnps", worker, token, "the test's server");
    auto call = [&](const proto::SessionRequest& req,
                    proto::SessionResponse* resp) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
      return stub_->Session(&ctx, req, resp).ok();
    };
    proto::SessionResponse challenge, done;
    if (!call(opener.Open(), &challenge)) return nullptr;
    absl::StatusOr<proto::SessionRequest> confirm = opener.OnChallenge(challenge);
    if (!confirm.ok() || !call(*confirm, &done)) return nullptr;
    return opener.Confirmed();
  }

  std::unique_ptr<proto::ParameterServer::Stub> stub_;
  const int num_workers_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<security::ClientSession>> sessions_
      ABSL_GUARDED_BY(mu_);
};

class TokenSessionInterceptor final : public grpc::experimental::Interceptor {
 public:
  TokenSessionInterceptor(std::shared_ptr<TokenSessions> sessions,
                          std::string method)
      : sessions_(std::move(sessions)), method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    if (m->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::
                PRE_SEND_INITIAL_METADATA)) {
      std::multimap<std::string, std::string>* md = m->GetSendInitialMetadata();
      auto t = md->find(std::string(security::kTokenMetadataKey));
      if (t != md->end()) {
        const std::string token = t->second;
        md->erase(t);
        auto g = md->find(proto::kGenerationMetadataKey);
        const std::string generation = g != md->end() ? g->second : "";
        if (std::shared_ptr<security::ClientSession> s = sessions_->For(token)) {
          md->emplace(std::string(security::kCallAuthMetadataKey),
                      s->Sign(method_, generation));
        }
      }
    }
    m->Proceed();
  }

 private:
  const std::shared_ptr<TokenSessions> sessions_;
  const std::string method_;
};

class TokenSessionFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenSessionFactory(std::shared_ptr<TokenSessions> sessions)
      : sessions_(std::move(sessions)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    return new TokenSessionInterceptor(sessions_, info->method());
  }

 private:
  const std::shared_ptr<TokenSessions> sessions_;
};

// A plaintext channel to `target` (a server of a job of `num_workers`
// named "bnps") whose calls' tokens become sessions.
inline std::shared_ptr<grpc::Channel> TokenSessionChannel(
    const std::string& target, int num_workers) {
  std::vector<std::unique_ptr<
      grpc::experimental::ClientInterceptorFactoryInterface>>
      factories;
  factories.push_back(std::make_unique<TokenSessionFactory>(
      std::make_shared<TokenSessions>(target, num_workers)));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, grpc::InsecureChannelCredentials(), grpc::ChannelArguments(),
      std::move(factories));
}

}  // namespace bnps::testing

#endif  // BNPS_TESTS_TOKEN_SESSION_TESTING_H_
