#include "client/internal/channel_auth.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/client_interceptor.h"
#include "proto/bnps.grpc.pb.h"
#include "proto/codec.h"
#include "proto/generation.h"
#include "security/job_token.h"

namespace bnps::client::internal {
namespace {

namespace exp = grpc::experimental;

constexpr char kSessionMethod[] = "/bnps.proto.ParameterServer/Session";

// Signs each call but the Session rpc's with the channel's session, if
// one is open, as its initial metadata leaves.
class SignInterceptor final : public exp::Interceptor {
 public:
  SignInterceptor(std::shared_ptr<ChannelAuth::Current> current,
                  std::string method)
      : current_(std::move(current)), method_(std::move(method)) {}

  void Intercept(exp::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            exp::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      std::shared_ptr<security::ClientSession> session;
      {
        absl::MutexLock lock(&current_->mu);
        session = current_->session;
      }
      if (session != nullptr) {
        std::multimap<std::string, std::string>* metadata =
            methods->GetSendInitialMetadata();
        const auto g = metadata->find(proto::kGenerationMetadataKey);
        const std::string generation =
            g != metadata->end() ? g->second : std::string();
        metadata->emplace(std::string(security::kCallAuthMetadataKey),
                          session->Sign(method_, generation));
      }
    }
    methods->Proceed();
  }

 private:
  const std::shared_ptr<ChannelAuth::Current> current_;
  const std::string method_;
};

class SignFactory final : public exp::ClientInterceptorFactoryInterface {
 public:
  explicit SignFactory(std::shared_ptr<ChannelAuth::Current> current)
      : current_(std::move(current)) {}

  exp::Interceptor* CreateClientInterceptor(exp::ClientRpcInfo* info) override {
    if (absl::string_view(info->method()) == kSessionMethod) return nullptr;
    return new SignInterceptor(current_, info->method());
  }

 private:
  const std::shared_ptr<ChannelAuth::Current> current_;
};

}  // namespace

ChannelAuth::ChannelAuth(Identity identity, std::string where)
    : identity_(std::move(identity)), where_(std::move(where)) {}

std::shared_ptr<grpc::Channel> ChannelAuth::Connect(
    const std::string& target,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    const grpc::ChannelArguments& args) {
  std::shared_ptr<grpc::Channel> channel;
  if (uses_sessions()) {
    std::vector<std::unique_ptr<exp::ClientInterceptorFactoryInterface>> f;
    f.push_back(std::make_unique<SignFactory>(current_));
    channel = exp::CreateCustomChannelWithInterceptors(target, credentials,
                                                        args, std::move(f));
  } else {
    channel = grpc::CreateCustomChannel(target, credentials, args);
  }
  absl::MutexLock lock(&mu_);
  channel_ = channel;
  return channel;
}

absl::Status ChannelAuth::Prepare(grpc::ClientContext* context,
                                  absl::Time deadline, uint64_t* session) {
  *session = 0;
  if (identity_.token.empty()) return absl::OkStatus();
  if (identity_.tls) {
    context->AddMetadata(std::string(security::kTokenMetadataKey),
                         identity_.token);
    return absl::OkStatus();
  }
  return Ensure(deadline, session);
}

absl::Status ChannelAuth::Ensure(absl::Time deadline, uint64_t* session) {
  *session = 0;
  if (!uses_sessions()) return absl::OkStatus();
  {
    absl::MutexLock lock(&current_->mu);
    if (current_->session != nullptr) {
      *session = current_->session->id();
      return absl::OkStatus();
    }
  }
  absl::MutexLock opening(&open_mu_);
  {
    absl::MutexLock lock(&current_->mu);  // opened while this one waited?
    if (current_->session != nullptr) {
      *session = current_->session->id();
      return absl::OkStatus();
    }
  }
  absl::StatusOr<std::shared_ptr<security::ClientSession>> opened =
      Open(deadline);
  if (!opened.ok()) return opened.status();
  *session = (*opened)->id();
  absl::MutexLock lock(&current_->mu);
  current_->session = *std::move(opened);
  return absl::OkStatus();
}

bool ChannelAuth::Forget(uint64_t session, const absl::Status& s) {
  if (session == 0 || s.code() != absl::StatusCode::kUnauthenticated) {
    return false;
  }
  absl::MutexLock lock(&current_->mu);
  if (current_->session != nullptr && current_->session->id() == session) {
    current_->session.reset();
  }
  return true;
}

absl::StatusOr<std::shared_ptr<security::ClientSession>> ChannelAuth::Open(
    absl::Time deadline) {
  std::shared_ptr<grpc::Channel> channel;
  {
    absl::MutexLock lock(&mu_);
    channel = channel_;
  }
  if (channel == nullptr) {
    return absl::FailedPreconditionError("ChannelAuth: not connected");
  }
  std::unique_ptr<proto::ParameterServer::Stub> stub =
      proto::ParameterServer::NewStub(channel);
  auto call = [&](const proto::SessionRequest& request,
                  proto::SessionResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    context.set_wait_for_ready(identity_.wait_for_ready);
    absl::Status s =
        proto::FromGrpcStatus(stub->Session(&context, request, response));
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat("opening a session with ",
                                               where_, ": ", s.message()));
  };
  security::SessionOpener opener(identity_.job, identity_.worker,
                                 identity_.token, where_);
  proto::SessionResponse challenge;
  if (absl::Status s = call(opener.Open(), &challenge); !s.ok()) return s;
  absl::StatusOr<proto::SessionRequest> confirm = opener.OnChallenge(challenge);
  if (!confirm.ok()) return confirm.status();
  proto::SessionResponse done;
  if (absl::Status s = call(*confirm, &done); !s.ok()) return s;
  return std::shared_ptr<security::ClientSession>(opener.Confirmed());
}

}  // namespace bnps::client::internal
