#include "bench/star_barrier.h"

namespace bnps::bench {

void GatherReactor::OnReadDone(bool ok) {
  if (!ok) return Finish(grpc::Status::OK);
  if (!hall_->Arrive(this)) Finish(grpc::Status::CANCELLED);
}

void GatherReactor::OnWriteDone(bool ok) {
  if (!ok) return Finish(grpc::Status::CANCELLED);
  StartRead(&blob_);
}

void GatherReactor::OnCancel() {
  if (hall_->Leave(this)) Finish(grpc::Status::CANCELLED);
}

bool GatherHall::Arrive(GatherReactor* r) {
  std::vector<GatherReactor*> go;
  {
    absl::MutexLock lock(&mu_);
    if (r->cancelled_) return false;
    std::vector<GatherReactor*>& group = waiting_[r->group()];
    group.push_back(r);
    if (static_cast<int>(group.size()) < r->group()) return true;
    go.swap(group);
  }
  for (GatherReactor* member : go) member->Answer();
  return true;
}

bool GatherHall::Leave(GatherReactor* r) {
  absl::MutexLock lock(&mu_);
  for (auto& [size, group] : waiting_) {
    auto it = std::find(group.begin(), group.end(), r);
    if (it != group.end()) {
      group.erase(it);
      return true;
    }
  }
  r->cancelled_ = true;
  return false;
}

}  // namespace bnps::bench
