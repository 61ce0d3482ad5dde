#include "worker/layer_pull.h"

#include <utility>

namespace bnps::worker {
namespace {

std::vector<std::string> Names(const nn::Model& model) {
  std::vector<std::string> names;
  for (const nn::Parameter* p : model.parameters()) names.push_back(p->name);
  return names;
}

}  // namespace

LayerPull::LayerPull(client::PsClient* client, const nn::Model& model)
    : client_(client), order_(Names(model)) {}

LayerPull::~LayerPull() { Stop(); }

void LayerPull::Start(int64_t min_version) {
  Stop();
  {
    absl::MutexLock lock(&mu_);
    error_ = absl::OkStatus();
  }
  pull_ = client_->StartPull(min_version, order_, &buffers_);
}

nn::Model::ParametersNeeded LayerPull::Hook(nn::Model* m,
                                            absl::Duration* waited) {
  return [this, m, waited](absl::Span<nn::Parameter* const> params) {
    for (nn::Parameter* p : params) {
      const absl::Time start = absl::Now();
      absl::Status s = pull_->Wait(p->name);
      if (waited != nullptr) *waited += absl::Now() - start;
      if (!s.ok()) {
        absl::MutexLock lock(&mu_);
        if (error_.ok()) error_ = s;
        return s;
      }
      // The pull no longer writes this entry: reading it needs no lock.
      const client::Param& value = buffers_.at(p->name);
      if (absl::Status s = m->SetParameter(p, value.shape, value.values);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  };
}

absl::Status LayerPull::Finish() {
  absl::Status s = pull_ != nullptr
                       ? pull_->Finish()
                       : absl::FailedPreconditionError("no pull started");
  pull_.reset();
  return s;
}

void LayerPull::Stop() { pull_.reset(); }

absl::Status LayerPull::error() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

}  // namespace bnps::worker
