#include "client/state_export.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/base/config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace bnps::client {
namespace {

static_assert(ABSL_IS_LITTLE_ENDIAN, "the export writes host-order bytes");

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  std::string out(v.size() * sizeof(T), '\0');
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::string Float32Bytes(const std::vector<double>& v) {
  return Bytes(std::vector<float>(v.begin(), v.end()));
}

}  // namespace

std::string TorchParameterName(const std::string& key) {
  for (const auto& [suffix, torch] :
       {std::pair<const char*, const char*>{".w", ".weight"},
        {".gamma", ".weight"},
        {".b", ".bias"},
        {".beta", ".bias"}}) {
    if (absl::EndsWith(key, suffix) && key.size() > std::strlen(suffix)) {
      return absl::StrCat(key.substr(0, key.size() - std::strlen(suffix)),
                          torch);
    }
  }
  return key;
}

absl::StatusOr<std::map<std::string, util::SafeTensor>> ExportTensors(
    const JobState& state) {
  std::map<std::string, util::SafeTensor> out;
  auto add = [&](const std::string& from, std::string name,
                 util::SafeTensor t) -> absl::Status {
    if (!out.emplace(name, std::move(t)).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "export: '", from, "' and another key both become '", name, "'"));
    }
    return absl::OkStatus();
  };
  for (const auto& [key, p] : state.params) {
    if (absl::Status s =
            add(key, TorchParameterName(key), {"F32", p.shape, Bytes(p.values)});
        !s.ok()) {
      return s;
    }
  }
  for (const auto& [layer, r] : state.running) {
    const std::vector<int64_t> shape = {static_cast<int64_t>(r.mean.size())};
    const std::vector<int64_t> tracked = {state.step};
    for (auto& [name, t] :
         {std::pair<std::string, util::SafeTensor>{
              layer + ".running_mean", {"F32", shape, Float32Bytes(r.mean)}},
          {layer + ".running_var", {"F32", shape, Float32Bytes(r.var)}},
          {layer + ".num_batches_tracked", {"I64", {}, Bytes(tracked)}}}) {
      if (absl::Status s = add(layer, name, t); !s.ok()) return s;
    }
  }
  return out;
}

absl::StatusOr<std::string> EncodeExport(const JobState& state) {
  absl::StatusOr<std::map<std::string, util::SafeTensor>> tensors =
      ExportTensors(state);
  if (!tensors.ok()) return tensors.status();
  return util::EncodeSafetensors(
      *tensors, {{"format", "pt"},
                 {"bnps_step", absl::StrCat(state.step)},
                 {"bnps_job_complete", state.job_complete ? "true" : "false"}});
}

absl::Status WriteExport(const JobState& state, const std::string& path) {
  absl::StatusOr<std::string> bytes = EncodeExport(state);
  if (!bytes.ok()) return bytes.status();
  return util::WriteFileAtomically(path, *bytes);
}

}  // namespace bnps::client
