// _bnps_native: the client library (client/grpc_ps_client.h) for Python, as
// a pybind11 extension. A thin layer: one Client per worker process, whose
// methods are PsClient's BN and clock calls with per-channel vectors as
// float64 NumPy arrays. The pure-Python package bnps (python/bnps/) wraps it;
// users import bnps, not this module.
//
// Errors: a call whose status is not OK raises _bnps_native.Error with
// args (code: int, code_name: str, message: str); bnps.errors turns it into
// the package's exception classes.
//
// Every call that talks to the servers releases the GIL while it waits, so
// other Python threads (a data loader, say) run meanwhile. Each such call
// holds its own reference to the connection: close() from another thread
// drops the Client's, and the connection goes away once the calls in flight
// have returned (they finish, or time out, as if close() had not been
// called); calls made after close() raise FAILED_PRECONDITION.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bn/kernels.h"
#include "bn/moments.h"
#include "client/grpc_ps_client.h"
#include "client/job_reader.h"
#include "client/state_export.h"
#include "policy/policy.h"
#include "pybind11/numpy.h"
#include "pybind11/pybind11.h"
#include "pybind11/stl.h"
#include "security/credentials.h"
#include "security/job_token.h"

namespace py = pybind11;

namespace bnps::python {
namespace {

using Array = py::array_t<double, py::array::c_style | py::array::forcecast>;

// The module's Error type, created in PYBIND11_MODULE.
PyObject* g_error_type = nullptr;

[[noreturn]] void Raise(const absl::Status& s) {
  py::tuple args = py::make_tuple(
      static_cast<int>(s.code()), absl::StatusCodeToString(s.code()),
      std::string(s.message()));
  PyErr_SetObject(g_error_type, args.ptr());
  throw py::error_already_set();
}

template <typename T>
T Value(absl::StatusOr<T> r) {
  if (!r.ok()) Raise(r.status());
  return *std::move(r);
}

void Check(const absl::Status& s) {
  if (!s.ok()) Raise(s);
}

std::vector<double> ToVector(const Array& a, const char* what) {
  if (a.ndim() != 1) {
    Raise(absl::InvalidArgumentError(
        absl::StrCat(what, " must be 1-D, not ", a.ndim(), "-D")));
  }
  return std::vector<double>(a.data(), a.data() + a.size());
}

Array ToArray(const std::vector<double>& v) {
  Array a(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

bn::Moments ToMoments(int64_t count, const Array& mean, const Array& m2) {
  bn::Moments m;
  m.count = count;
  m.mean = ToVector(mean, "mean");
  m.m2 = ToVector(m2, "m2");
  return m;
}

py::dict ConfigDict(const proto::JobConfig& c) {
  py::dict d;
  d["job"] = c.job();
  d["num_workers"] = c.num_workers();
  d["num_shards"] = c.num_shards();
  // "policy" is the BN policy; "gradients" the gradient mode (sync, async).
  absl::StatusOr<policy::JobPolicy> jp = policy::FromConfig(c);
  d["policy"] = jp.ok() ? policy::PolicyName(jp->bn) : std::string("unknown");
  d["gradients"] = jp.ok() ? policy::GradientsName(jp->gradients)
                           : std::string("unknown");
  d["staleness"] = c.staleness();
  d["learning_rate"] = c.learning_rate();
  d["momentum"] = c.momentum();
  d["weight_decay"] = c.weight_decay();
  d["bn_momentum"] = c.bn_momentum();
  d["barrier_timeout_ms"] = c.barrier_timeout_ms();
  d["heartbeat_timeout_ms"] = c.heartbeat_timeout_ms();
  return d;
}

// One worker's connection to the job's shard servers.
using FloatArray =
    py::array_t<float, py::array::c_style | py::array::forcecast>;

// {name: float32 array of any shape} -> Params.
client::Params ToParams(const py::dict& d) {
  client::Params params;
  for (auto item : d) {
    std::string name = py::cast<std::string>(item.first);
    FloatArray a = py::cast<FloatArray>(item.second);
    client::Param p;
    for (py::ssize_t i = 0; i < a.ndim(); ++i) p.shape.push_back(a.shape(i));
    p.values.assign(a.data(), a.data() + a.size());
    params.emplace(std::move(name), std::move(p));
  }
  return params;
}

py::dict FromParams(const client::Params& params) {
  py::dict d;
  for (const auto& [name, p] : params) {
    std::vector<py::ssize_t> shape(p.shape.begin(), p.shape.end());
    FloatArray a(shape);
    std::copy(p.values.begin(), p.values.end(), a.mutable_data());
    d[py::str(name)] = std::move(a);
  }
  return d;
}

class Client {
 public:
  Client(std::vector<std::string> servers, std::string job, int worker,
         int num_workers, std::string token_file, std::string tls_ca,
         std::string tls_cert, std::string tls_key, double connect_timeout_s,
         double rpc_timeout_s) {
    client::GrpcClientOptions o;
    o.servers = std::move(servers);
    o.job = std::move(job);
    o.worker = worker;
    o.num_workers = num_workers;
    o.connect_timeout = absl::Seconds(connect_timeout_s);
    o.rpc_timeout = absl::Seconds(rpc_timeout_s);
    if (!token_file.empty()) {
      o.token = Value(security::ReadTokenFile(token_file));
    }
    security::TlsFiles tls{std::move(tls_cert), std::move(tls_key),
                           std::move(tls_ca)};
    if (security::UsesTls(tls)) {
      o.credentials = Value(security::MakeChannelCredentials(tls));
    }
    absl::StatusOr<std::unique_ptr<client::GrpcPsClient>> c;
    {
      py::gil_scoped_release release;
      c = client::GrpcPsClient::Connect(std::move(o));
    }
    client_ = Value(std::move(c));  // unique_ptr -> shared_ptr
  }

  // A reference to the connection; raises once closed. REQUIRES: the GIL
  // (it guards client_).
  std::shared_ptr<client::GrpcPsClient> get() {
    if (client_ == nullptr) {
      Raise(absl::FailedPreconditionError("the bnps client is closed"));
    }
    return client_;
  }

  // fn(client) without the GIL, holding a reference for its duration: a
  // concurrent close() cannot destroy the client under it. Dropped without
  // the GIL too, as it may be the last (destroying the client joins its
  // background thread).
  template <typename Fn>
  auto Call(Fn fn) {
    std::shared_ptr<client::GrpcPsClient> c = get();
    py::gil_scoped_release release;
    auto result = fn(*c);
    c.reset();
    return result;
  }

  void Close() {
    std::shared_ptr<client::GrpcPsClient> c = std::move(client_);
    client_ = nullptr;
    py::gil_scoped_release release;
    c.reset();
  }
  bool closed() const { return client_ == nullptr; }

  // Returns (count, mean, m2, running_mean or None, running_var or None,
  // contributors).
  py::tuple BnForward(const std::string& layer, int64_t step, int64_t count,
                      const Array& mean, const Array& m2, bool want_running) {
    bn::Moments local = ToMoments(count, mean, m2);
    absl::StatusOr<client::BnForwardResult> r =
        Call([&](client::GrpcPsClient& c) {
          return c.BnForward(layer, step, local, want_running);
        });
    client::BnForwardResult v = Value(std::move(r));
    py::object rm = py::none(), rv = py::none();
    if (v.running.has_value()) {
      rm = ToArray(v.running->mean);
      rv = ToArray(v.running->var);
    }
    return py::make_tuple(v.merged.count, ToArray(v.merged.mean),
                          ToArray(v.merged.m2), rm, rv, v.contributors);
  }

  // Returns (sum_dy, sum_dy_xhat) over every worker.
  py::tuple BnBackward(const std::string& layer, int64_t step,
                       const Array& sum_dy, const Array& sum_dy_xhat) {
    bn::BackwardSums local{ToVector(sum_dy, "sum_dy"),
                           ToVector(sum_dy_xhat, "sum_dy_xhat")};
    absl::StatusOr<bn::BackwardSums> r = Call([&](client::GrpcPsClient& c) {
      return c.BnBackward(layer, step, local);
    });
    bn::BackwardSums v = Value(std::move(r));
    return py::make_tuple(ToArray(v.sum_dy), ToArray(v.sum_dy_xhat));
  }

  void BnRecal(const std::string& layer, int64_t batch, int64_t count,
               const Array& mean, const Array& m2) {
    bn::Moments m = ToMoments(count, mean, m2);
    absl::Status s = Call([&](client::GrpcPsClient& c) {
      return c.BnRecal(layer, batch, m);
    });
    Check(s);
  }

  py::tuple Running(absl::StatusOr<bn::RunningStats> r) {
    bn::RunningStats v = Value(std::move(r));
    return py::make_tuple(ToArray(v.mean), ToArray(v.var));
  }

  py::tuple BnRecalFinish(const std::string& layer) {
    absl::StatusOr<bn::RunningStats> r = Call([&](client::GrpcPsClient& c) {
      return c.BnRecalFinish(layer);
    });
    return Running(std::move(r));
  }

  py::tuple BnLocalRunning(const std::string& layer, const Array& mean,
                           const Array& var) {
    bn::RunningStats running{ToVector(mean, "mean"), ToVector(var, "var")};
    absl::StatusOr<bn::RunningStats> r = Call([&](client::GrpcPsClient& c) {
      return c.BnLocalRunning(layer, running);
    });
    return Running(std::move(r));
  }

  py::tuple BnRunning(const std::string& layer, int64_t channels) {
    absl::StatusOr<bn::RunningStats> r = Call([&](client::GrpcPsClient& c) {
      return c.BnRunning(layer, channels);
    });
    return Running(std::move(r));
  }

  int64_t StartStep(int64_t step) {
    absl::StatusOr<int64_t> r = Call([&](client::GrpcPsClient& c) {
      return c.StartStep(step);
    });
    return Value(std::move(r));
  }

  void FinishStep(int64_t completed) {
    absl::Status s = Call([&](client::GrpcPsClient& c) {
      return c.FinishStep(completed);
    });
    Check(s);
  }

  // This worker finished the job (PsClient::Leave).
  void Leave() {
    Check(Call([](client::GrpcPsClient& c) { return c.Leave(); }));
  }

  void InitParameters(const py::dict& params) {
    client::Params p = ToParams(params);
    absl::Status s = Call([&](client::GrpcPsClient& c) {
      return c.InitParameters(p);
    });
    Check(s);
  }

  void PushGradients(int64_t step, int64_t num_samples, const py::dict& grads) {
    auto p = std::make_shared<const client::Params>(ToParams(grads));
    absl::Status s = Call([&](client::GrpcPsClient& c) {
      return c.PushGradients(step, num_samples, std::move(p));
    });
    Check(s);
  }

  // The parameters named in `keys` (every key of the job if empty), once
  // each has at least `min_version` updates applied.
  py::dict PullParameters(int64_t min_version,
                          const std::vector<std::string>& keys) {
    absl::StatusOr<client::Params> r = Call([&](client::GrpcPsClient& c) {
      return keys.empty() ? c.PullParameters(min_version)
                          : c.PullParameters(keys, min_version);
    });
    return FromParams(Value(std::move(r)));
  }

  std::vector<int> LiveWorkers() { return get()->LiveWorkers(); }
  py::dict Config() { return ConfigDict(get()->config()); }
  int worker() { return get()->worker(); }
  int num_workers() { return get()->num_workers(); }

 private:
  // Guarded by the GIL; shared with the calls in flight (Call).
  std::shared_ptr<client::GrpcPsClient> client_;
};

// merge(a, b), a first (bn::MergeInto): what the async policy normalizes
// with, own moments first (policy/async_bn.h). Returns (count, mean, m2).
py::tuple MergeMoments(int64_t count_a, const Array& mean_a, const Array& m2_a,
                       int64_t count_b, const Array& mean_b,
                       const Array& m2_b) {
  bn::Moments a = ToMoments(count_a, mean_a, m2_a);
  bn::Moments b = ToMoments(count_b, mean_b, m2_b);
  Check(bn::ValidateMoments(a));
  Check(bn::ValidateMoments(b));
  if (a.channels() != b.channels()) {
    Raise(absl::InvalidArgumentError("moments of different channel counts"));
  }
  bn::Moments acc = a;
  bn::MergeInto(b, &acc);
  return py::make_tuple(acc.count, ToArray(acc.mean), ToArray(acc.m2));
}

// Reads every shard without joining the job (client::JobReader) and writes
// the safetensors export (client/state_export.h) to `path`, as bnps_status
// --export does. Returns {"step", "job_complete", "parameters",
// "bn_layers"}.
py::dict Export(std::vector<std::string> servers, std::string path,
                std::string job, std::string token_file, std::string tls_ca,
                std::string tls_cert, std::string tls_key, double timeout_s) {
  client::JobReaderOptions o;
  o.servers = std::move(servers);
  o.job = std::move(job);
  o.timeout = absl::Seconds(timeout_s);
  if (!token_file.empty()) o.token = Value(security::ReadTokenFile(token_file));
  security::TlsFiles tls{std::move(tls_cert), std::move(tls_key),
                         std::move(tls_ca)};
  if (security::UsesTls(tls)) {
    o.credentials = Value(security::MakeChannelCredentials(tls));
  }
  std::unique_ptr<client::JobReader> reader =
      Value(client::JobReader::Create(std::move(o)));
  absl::StatusOr<client::JobState> state;
  absl::Status written;
  {
    py::gil_scoped_release release;
    state = reader->ReadState();
    if (state.ok()) written = client::WriteExport(*state, path);
  }
  Check(state.status());
  Check(written);
  py::dict d;
  d["step"] = state->step;
  d["job_complete"] = state->job_complete;
  d["parameters"] = state->params.size();
  d["bn_layers"] = state->running.size();
  return d;
}

}  // namespace
}  // namespace bnps::python

PYBIND11_MODULE(_bnps_native, m) {
  using bnps::python::Client;
  m.doc() = "The bnps client library (internal; import bnps instead).";
  static py::exception<std::runtime_error> error(m, "Error",
                                                 PyExc_RuntimeError);
  bnps::python::g_error_type = error.ptr();

  m.def("export", &bnps::python::Export, py::arg("servers"), py::arg("path"),
        py::arg("job") = "bnps", py::arg("token_file") = "",
        py::arg("tls_ca") = "", py::arg("tls_cert") = "",
        py::arg("tls_key") = "", py::arg("timeout_s") = 30.0);
  m.def("merge_moments", &bnps::python::MergeMoments, py::arg("count_a"),
        py::arg("mean_a"), py::arg("m2_a"), py::arg("count_b"),
        py::arg("mean_b"), py::arg("m2_b"));

  py::class_<Client>(m, "Client")
      .def(py::init<std::vector<std::string>, std::string, int, int,
                    std::string, std::string, std::string, std::string,
                    double, double>(),
           py::arg("servers"), py::arg("job"), py::arg("worker"),
           py::arg("num_workers"), py::arg("token_file") = "",
           py::arg("tls_ca") = "", py::arg("tls_cert") = "",
           py::arg("tls_key") = "", py::arg("connect_timeout_s") = 30.0,
           py::arg("rpc_timeout_s") = 30.0)
      .def("close", &Client::Close)
      .def_property_readonly("closed", &Client::closed)
      .def("config", &Client::Config)
      .def("worker", &Client::worker)
      .def("num_workers", &Client::num_workers)
      .def("live_workers", &Client::LiveWorkers)
      .def("bn_forward", &Client::BnForward, py::arg("layer"), py::arg("step"),
           py::arg("count"), py::arg("mean"), py::arg("m2"),
           py::arg("want_running") = false)
      .def("bn_backward", &Client::BnBackward, py::arg("layer"),
           py::arg("step"), py::arg("sum_dy"), py::arg("sum_dy_xhat"))
      .def("bn_recal", &Client::BnRecal, py::arg("layer"), py::arg("batch"),
           py::arg("count"), py::arg("mean"), py::arg("m2"))
      .def("bn_recal_finish", &Client::BnRecalFinish, py::arg("layer"))
      .def("bn_local_running", &Client::BnLocalRunning, py::arg("layer"),
           py::arg("mean"), py::arg("var"))
      .def("bn_running", &Client::BnRunning, py::arg("layer"),
           py::arg("channels"))
      .def("init_parameters", &Client::InitParameters, py::arg("params"))
      .def("push_gradients", &Client::PushGradients, py::arg("step"),
           py::arg("num_samples"), py::arg("grads"))
      .def("pull_parameters", &Client::PullParameters, py::arg("min_version"),
           py::arg("keys") = std::vector<std::string>{})
      .def("start_step", &Client::StartStep, py::arg("step"))
      .def("finish_step", &Client::FinishStep, py::arg("completed"))
      .def("leave", &Client::Leave);
}
