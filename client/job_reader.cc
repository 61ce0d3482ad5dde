#include "client/job_reader.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "proto/bnps.grpc.pb.h"
#include "proto/codec.h"
#include "proto/limits.h"
#include "client/internal/channel_auth.h"
#include "util/sha256.h"

namespace bnps::client {

absl::StatusOr<std::unique_ptr<JobReader>> JobReader::Create(
    JobReaderOptions options) {
  if (options.servers.empty()) {
    return absl::InvalidArgumentError("JobReader: no servers");
  }
  if (options.job.empty()) {
    return absl::InvalidArgumentError("JobReader: the job name is empty");
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("JobReader: the timeout must be positive");
  }
  return std::unique_ptr<JobReader>(new JobReader(std::move(options)));
}

struct JobReader::Stubs {
  std::vector<std::unique_ptr<proto::ParameterServer::Stub>> of;
};

JobReader::JobReader(JobReaderOptions options)
    : options_(std::move(options)), stubs_(std::make_unique<Stubs>()) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(proto::kMaxMessageBytes);
  args.SetMaxSendMessageSize(proto::kMaxMessageBytes);
  const bool tls = options_.credentials != nullptr;
  for (size_t i = 0; i < options_.servers.size(); ++i) {
    internal::ChannelAuth::Identity identity;
    identity.job = options_.job;
    identity.worker = -1;  // a reader speaks for no worker
    identity.token = options_.token;
    identity.tls = tls;
    identity.wait_for_ready = options_.wait_for_ready;
    auth_.push_back(std::make_unique<internal::ChannelAuth>(
        std::move(identity), ShardName(static_cast<int>(i))));
    stubs_->of.push_back(proto::ParameterServer::NewStub(auth_.back()->Connect(
        options_.servers[i],
        tls ? options_.credentials : grpc::InsecureChannelCredentials(),
        args)));
  }
}

JobReader::~JobReader() = default;

template <typename Attempt>
absl::Status JobReader::Call(int shard, Attempt attempt) const {
  const absl::Time deadline = absl::Now() + options_.timeout;
  return auth_[shard]->Run(
      deadline,
      [&](grpc::ClientContext* context) {
        context->set_deadline(absl::ToChronoTime(deadline));
        context->set_wait_for_ready(options_.wait_for_ready);
      },
      attempt);
}

std::string JobReader::ShardName(int shard) const {
  return absl::StrCat("shard ", shard, " (", options_.servers[shard], ")");
}

namespace {

absl::Status Context(const absl::Status& s, absl::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

}  // namespace

absl::StatusOr<proto::StatusResponse> JobReader::GetStatus(int shard) const {
  if (shard < 0 || shard >= num_shards()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GetStatus: shard ", shard, " is not in [0, ", num_shards(), ")"));
  }
  proto::StatusResponse resp;
  absl::Status s = Call(shard, [&](grpc::ClientContext& context) {
    return proto::FromGrpcStatus(
        stubs_->of[shard]->GetStatus(&context, proto::StatusRequest(), &resp));
  });
  if (!s.ok()) return s;  // as the shard's call gave it (callers name it)
  return resp;
}

absl::StatusOr<JobDigest> JobReader::GetDigest() const {
  std::map<std::string, std::string> entries;  // key -> its SHA-256
  int64_t step = INT64_MAX;
  for (int i = 0; i < num_shards(); ++i) {
    proto::DigestResponse resp;
    absl::Status s = Call(i, [&](grpc::ClientContext& context) {
      return proto::FromGrpcStatus(
          stubs_->of[i]->GetDigest(&context, proto::DigestRequest(), &resp));
    });
    if (!s.ok()) return Context(s, absl::StrCat("GetDigest of ", ShardName(i)));
    for (const auto& e : resp.entries()) entries[e.key()] = e.sha256();
    step = std::min<int64_t>(step, resp.step());
  }
  util::Sha256 h;
  for (const auto& [key, hash] : entries) {
    h.Update(key);
    h.Update(absl::string_view("\0", 1));
    h.Update(hash);
  }
  return JobDigest{util::Hex(h.Final()), step == INT64_MAX ? 0 : step};
}

absl::Status JobReader::ReadShard(int shard, JobState* state) const {
  return Call(shard, [&](grpc::ClientContext& context) {
    return ReadStream(shard, context, state);
  });
}

absl::Status JobReader::ReadStream(int shard, grpc::ClientContext& context,
                                   JobState* state) const {
  const std::string name = ShardName(shard);
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed response from ", name, ": ", what));
  };
  proto::ReadStateRequest req;
  req.set_job(options_.job);
  std::unique_ptr<grpc::ClientReader<proto::ReadStateResponse>> reader =
      stubs_->of[shard]->ReadState(&context, req);
  proto::ReadStateResponse msg;
  bool first = true;
  // Tensors and layers of this shard still being filled: elements so far.
  std::map<std::string, int64_t> filled;
  std::map<std::string, int64_t> bn_filled;
  while (reader->Read(&msg)) {
    if (first) {
      state->step = std::min(state->step, msg.step());
      state->job_complete = state->job_complete && msg.job_complete();
      first = false;
    }
    for (const proto::TensorChunk& c : msg.chunks()) {
      absl::StatusOr<int64_t> n = proto::NumElements(c.shape());
      if (!n.ok()) return bad(std::string(n.status().message()));
      absl::StatusOr<std::vector<float>> part = proto::DecodeFloat32(c.part());
      if (!part.ok()) return bad(std::string(part.status().message()));
      Param& p = state->params[c.key()];
      int64_t& done = filled[c.key()];
      if (done == 0 && c.offset() == 0) {
        if (!p.shape.empty() || !p.values.empty()) {
          return bad(absl::StrCat("parameter '", c.key(),
                                  "' also came from another shard"));
        }
        p.shape.assign(c.shape().begin(), c.shape().end());
        p.values.resize(*n);
      }
      if (c.offset() != done ||
          done + static_cast<int64_t>(part->size()) > *n ||
          static_cast<int64_t>(p.values.size()) != *n) {
        return bad(absl::StrCat("chunk of '", c.key(), "' out of order"));
      }
      std::copy(part->begin(), part->end(), p.values.begin() + done);
      done += static_cast<int64_t>(part->size());
    }
    for (const proto::BnRunningChunk& c : msg.bn()) {
      if (c.channels() < 0 || c.channels() > proto::kMaxChannels) {
        return bad(absl::StrCat("BN layer '", c.layer(), "' has ",
                                c.channels(), " channels"));
      }
      absl::StatusOr<bn::RunningStats> part = proto::DecodeRunning(c.part());
      if (!part.ok()) return bad(std::string(part.status().message()));
      bn::RunningStats& r = state->running[c.layer()];
      int64_t& done = bn_filled[c.layer()];
      if (done == 0 && c.offset() == 0) {
        if (!r.mean.empty()) {
          return bad(absl::StrCat("BN layer '", c.layer(),
                                  "' also came from another shard"));
        }
        r.mean.resize(c.channels());
        r.var.resize(c.channels());
      }
      if (c.offset() != done ||
          done + static_cast<int64_t>(part->mean.size()) > c.channels() ||
          static_cast<int64_t>(r.mean.size()) != c.channels()) {
        return bad(absl::StrCat("BN layer '", c.layer(), "' out of order"));
      }
      std::copy(part->mean.begin(), part->mean.end(), r.mean.begin() + done);
      std::copy(part->var.begin(), part->var.end(), r.var.begin() + done);
      done += static_cast<int64_t>(part->mean.size());
    }
  }
  absl::Status s = proto::FromGrpcStatus(reader->Finish());
  if (!s.ok()) return Context(s, absl::StrCat("ReadState of ", name));
  if (first) return bad("no message");
  for (const auto& [key, done] : filled) {
    if (done != static_cast<int64_t>(state->params[key].values.size())) {
      return bad(absl::StrCat("parameter '", key, "' incomplete"));
    }
  }
  for (const auto& [layer, done] : bn_filled) {
    if (done != static_cast<int64_t>(state->running[layer].mean.size())) {
      return bad(absl::StrCat("BN layer '", layer, "' incomplete"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<JobState> JobReader::ReadState() const {
  JobState state;
  state.step = INT64_MAX;
  state.job_complete = true;
  for (int i = 0; i < num_shards(); ++i) {
    if (absl::Status s = ReadShard(i, &state); !s.ok()) return s;
  }
  if (state.step == INT64_MAX) state.step = 0;
  return state;
}

}  // namespace bnps::client
