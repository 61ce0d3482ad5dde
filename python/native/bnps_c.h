/* libbnps: the bnps client library (client/grpc_ps_client.h) and the worker
 * side of the BN policies (client/worker_bn.h) behind a plain C ABI, so one
 * build serves every Python (bnps/_native.py loads it with ctypes) and any
 * other language with a C FFI. Only the bnps_* symbols below are exported
 * (a version script, bnps_c.lds); gRPC, protobuf and Abseil stay private.
 *
 * Conventions.
 *  - Opaque handles, created by a *_new / *_connect call and released by the
 *    matching *_free; a handle may be freed once, by its creator.
 *  - Calls that can fail return a status code: 0 OK, otherwise an
 *    absl::StatusCode (3 INVALID_ARGUMENT, 4 DEADLINE_EXCEEDED, 5 NOT_FOUND,
 *    9 FAILED_PRECONDITION, 14 UNAVAILABLE, ...), and write the message,
 *    NUL-terminated and truncated to fit, into `err` (`err_len` bytes; `err`
 *    may be NULL). bnps_status_name names a code.
 *  - Arrays are the caller's: per-channel vectors are float64 arrays of
 *    `channels` elements, parameters float32 row-major; nothing keeps a
 *    pointer to them after the call returns. Results of a size the caller
 *    cannot know (bnps_client_bn_recal_finish, bnps_client_pull) come as a
 *    bnps_arrays handle to copy out of and free.
 *  - Thread-safety: a bnps_client may be used from several threads at once;
 *    bnps_client_close may run while calls are in flight (they finish or
 *    time out as if it had not come; later calls fail with
 *    FAILED_PRECONDITION). bnps_worker_bn is immutable. Calls that talk to
 *    the servers block; ctypes releases the GIL around them. */

#ifndef BNPS_PYTHON_NATIVE_BNPS_C_H_
#define BNPS_PYTHON_NATIVE_BNPS_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BNPS_EXPORT __attribute__((visibility("default")))

/* The ABI's version; a new version only adds functions (2: the layer steps,
 * bnps_layer_forward and bnps_layer_backward; 3: bnps_client_connect2; 4:
 * bnps_layer_exchange_forward and bnps_layer_exchange_backward; 5: the
 * stream-ordered exchanges, bnps_stream_queue_*; 6: the client's metrics,
 * bnps_client_serve_metrics and bnps_client_metrics_text, and
 * bnps_client_connect3; 7: bnps_resolve_policy; 8: the layer steps on one
 * prepared argument block, bnps_layer_pass_forward and
 * bnps_layer_pass_backward; 9: the device layer passes, bnps_device_pass_*,
 * the queue's count of host waits, bnps_stream_queue_waits and
 * bnps_stream_queue_note_wait, and its time in exchanges,
 * bnps_stream_queue_exchange_seconds; and the recording queue of the
 * tests, bnps_stream_queue_new_recording and bnps_stream_queue_record; 10:
 * the device passes on one prepared argument block, bnps_device_call_*). */
#define BNPS_C_API_VERSION 10
BNPS_EXPORT int bnps_api_version(void);
/* "OK", "INVALID_ARGUMENT", ...; a static string. */
BNPS_EXPORT const char* bnps_status_name(int code);

/* --- the job's policies (policy/policy.h) --- */

/* policy::ResolvePolicy: the BN policy and gradient mode that bnps_server's
 * and bnps_worker's --policy, --bn_policy and --gradients name (each NULL or
 * empty: not given), as a JSON object into `json` (`len` bytes):
 *   {"bn_policy": "async", "gradients": "sync",
 *    "name": "bn_policy=async,gradients=sync",
 *    "flags": ["--bn_policy=async", "--gradients=sync"],
 *    "policies": ["sync", "async", "recal", "local"],
 *    "gradient_modes": ["sync", "async"]}
 * "name" is policy::JobPolicyName, "flags" the flags that name the pair to
 * the binaries (policy::JobPolicyFlags), "policies" and "gradient_modes"
 * every choice. INVALID_ARGUMENT, with the binaries' own message, for an
 * unknown name or a --policy that contradicts --bn_policy or --gradients;
 * RESOURCE_EXHAUSTED if the object does not fit in `len` bytes. */
BNPS_EXPORT int bnps_resolve_policy(const char* policy, const char* bn_policy,
                                    const char* gradients, char* json,
                                    size_t len, char* err, size_t err_len);

/* --- named arrays that a call returns --- */
typedef struct bnps_arrays bnps_arrays;
BNPS_EXPORT int64_t bnps_arrays_size(const bnps_arrays* a);
/* Entry i (0 <= i < size): its name (valid until the handle is freed), its
 * element type (4: float32, 8: float64), rank, shape and elements. */
BNPS_EXPORT const char* bnps_arrays_name(const bnps_arrays* a, int64_t i);
BNPS_EXPORT int bnps_arrays_itemsize(const bnps_arrays* a, int64_t i);
BNPS_EXPORT int bnps_arrays_ndim(const bnps_arrays* a, int64_t i);
BNPS_EXPORT void bnps_arrays_shape(const bnps_arrays* a, int64_t i,
                                   int64_t* shape);
BNPS_EXPORT int64_t bnps_arrays_numel(const bnps_arrays* a, int64_t i);
/* Copies entry i's numel * itemsize bytes to `dst`. */
BNPS_EXPORT void bnps_arrays_copy(const bnps_arrays* a, int64_t i, void* dst);
BNPS_EXPORT void bnps_arrays_free(bnps_arrays* a);

/* --- one worker's connection to a job's shard servers --- */
typedef struct bnps_client bnps_client;

/* Connects to every server of `servers` (comma-separated, shard order) as
 * worker `worker` of `num_workers`; empty strings leave the token and TLS
 * off. UNAVAILABLE when a server cannot be reached within
 * connect_timeout_s, FAILED_PRECONDITION when the servers run another job. */
BNPS_EXPORT int bnps_client_connect(
    const char* servers, const char* job, int worker, int num_workers,
    const char* token_file, const char* tls_ca, const char* tls_cert,
    const char* tls_key, double connect_timeout_s, double rpc_timeout_s,
    bnps_client** out, char* err, size_t err_len);
/* bnps_client_connect, and a BN call polls for its answer for bn_spin_us
 * microseconds before it sleeps (0 to 1000000; -1: 1000 where this machine
 * has a core for every worker and server of the job, else 0, as bnps_worker
 * --bn_spin_us=-1 with one model thread). bnps_client_connect is this with
 * 0. */
BNPS_EXPORT int bnps_client_connect2(
    const char* servers, const char* job, int worker, int num_workers,
    const char* token_file, const char* tls_ca, const char* tls_cert,
    const char* tls_key, double connect_timeout_s, double rpc_timeout_s,
    int bn_spin_us, bnps_client** out, char* err, size_t err_len);
/* bnps_client_connect2, and the BN traffic goes through this host's BN
 * aggregator (bnps_host_bn) at `bn_host_aggregator` ("host:port"; empty or
 * NULL: to each shard directly), as bnps_worker --bn_host_aggregator:
 * client/grpc_options.h says how. bnps_client_connect2 is this with none. */
BNPS_EXPORT int bnps_client_connect3(
    const char* servers, const char* job, int worker, int num_workers,
    const char* token_file, const char* tls_ca, const char* tls_cert,
    const char* tls_key, double connect_timeout_s, double rpc_timeout_s,
    int bn_spin_us, const char* bn_host_aggregator, bnps_client** out,
    char* err, size_t err_len);
/* Stops heartbeating and drops the connection (idempotent). */
BNPS_EXPORT void bnps_client_close(bnps_client* c);
BNPS_EXPORT int bnps_client_closed(bnps_client* c);
/* Closes and releases the handle. REQUIRES: no call in flight on it. */
BNPS_EXPORT void bnps_client_free(bnps_client* c);

/* Serves the client's Prometheus metrics at http://host:port/metrics (port
 * 0: a free one; *bound_port gets the port) on two threads of its own, until
 * the handle is freed: bnps_worker's series (docs/observability.md), the BN
 * round trips per layer and pass (bnps_worker_bn_round_trip_seconds: every
 * BN call answered since Connect, timed around the call) and the retries
 * (bnps_worker_retries_total). Plain HTTP without authentication: keep
 * `host` on a trusted network. INVALID_ARGUMENT for a port outside [0,
 * 65535], UNAVAILABLE when it cannot listen there, FAILED_PRECONDITION when
 * the client serves already. */
BNPS_EXPORT int bnps_client_serve_metrics(bnps_client* c, const char* host,
                                          int port, int* bound_port, char* err,
                                          size_t err_len);
/* The same metrics in the Prometheus text format, NUL-terminated, into
 * `buf` (`len` bytes); *needed: the bytes they take, the NUL included.
 * RESOURCE_EXHAUSTED when they do not fit. */
BNPS_EXPORT int bnps_client_metrics_text(bnps_client* c, char* buf, size_t len,
                                         size_t* needed, char* err,
                                         size_t err_len);

/* The job as a JSON object: job, num_workers, num_shards, policy (the BN
 * policy), gradients, staleness, bn_group_size, bn_staleness (-1: the
 * bounded mode), learning_rate, momentum,
 * weight_decay, bn_momentum, barrier_timeout_ms, heartbeat_timeout_ms. RESOURCE_EXHAUSTED
 * if it does not fit in `len` bytes. */
BNPS_EXPORT int bnps_client_config_json(bnps_client* c, char* buf, size_t len,
                                        char* err, size_t err_len);
/* The live workers' ids into `ids` (up to `cap`), their number in *n. */
BNPS_EXPORT int bnps_client_live_workers(bnps_client* c, int* ids, int cap,
                                         int* n, char* err, size_t err_len);

/* PsClient::BnForward. The answer's moments into out_* (`channels` each);
 * with want_running, *has_running says whether run_mean/run_var were
 * written. */
BNPS_EXPORT int bnps_client_bn_forward(
    bnps_client* c, const char* layer, int64_t step, int64_t count,
    const double* mean, const double* m2, int64_t channels, int want_running,
    int64_t* out_count, double* out_mean, double* out_m2, int* has_running,
    double* run_mean, double* run_var, int* contributors, char* err,
    size_t err_len);
BNPS_EXPORT int bnps_client_bn_backward(
    bnps_client* c, const char* layer, int64_t step, const double* sum_dy,
    const double* sum_dy_xhat, int64_t channels, double* out_sum_dy,
    double* out_sum_dy_xhat, char* err, size_t err_len);
BNPS_EXPORT int bnps_client_bn_recal(bnps_client* c, const char* layer,
                                     int64_t batch, int64_t count,
                                     const double* mean, const double* m2,
                                     int64_t channels, char* err,
                                     size_t err_len);
/* Population statistics as arrays "mean" and "var" (float64). */
BNPS_EXPORT int bnps_client_bn_recal_finish(bnps_client* c, const char* layer,
                                            bnps_arrays** out, char* err,
                                            size_t err_len);
/* The workers' average (local) / the servers' (running) statistics into
 * out_mean and out_var. */
BNPS_EXPORT int bnps_client_bn_local_running(
    bnps_client* c, const char* layer, const double* mean, const double* var,
    int64_t channels, double* out_mean, double* out_var, char* err,
    size_t err_len);
BNPS_EXPORT int bnps_client_bn_running(bnps_client* c, const char* layer,
                                       int64_t channels, double* out_mean,
                                       double* out_var, char* err,
                                       size_t err_len);
BNPS_EXPORT int bnps_client_start_step(bnps_client* c, int64_t step,
                                       int64_t* out, char* err,
                                       size_t err_len);
/* This worker finished the job (PsClient::Leave): its last call. The call
 * that completes the job returns once every shard wrote its final
 * checkpoint. */
BNPS_EXPORT int bnps_client_leave(bnps_client* c, char* err, size_t err_len);
BNPS_EXPORT int bnps_client_finish_step(bnps_client* c, int64_t completed,
                                        char* err, size_t err_len);
/* One training iteration's brackets, as the job's gradient mode says: under
 * async gradients bnps_client_begin_step is bnps_client_start_step (it waits
 * until the staleness bound lets `step` begin; *out its answer) and
 * bnps_client_end_step is bnps_client_finish_step; under sync gradients,
 * where the pushes themselves are the step's barrier, both do nothing and
 * *out is `step`. A frontend calls these around every iteration and needs
 * no rule of its own. */
BNPS_EXPORT int bnps_client_begin_step(bnps_client* c, int64_t step,
                                       int64_t* out, char* err,
                                       size_t err_len);
BNPS_EXPORT int bnps_client_end_step(bnps_client* c, int64_t completed,
                                     char* err, size_t err_len);

/* Parameters in: `n` tensors, tensor i named names[i] with ndims[i]
 * dimensions (its shape the next ndims[i] entries of `shapes`, all
 * concatenated) and float32 elements data[i]. */
BNPS_EXPORT int bnps_client_init_parameters(
    bnps_client* c, int n, const char* const* names, const int* ndims,
    const int64_t* shapes, const float* const* data, char* err,
    size_t err_len);
BNPS_EXPORT int bnps_client_push_gradients(
    bnps_client* c, int64_t step, int64_t num_samples, int n,
    const char* const* names, const int* ndims, const int64_t* shapes,
    const float* const* data, char* err, size_t err_len);
/* The named keys (every key of the job when n_keys is 0) once each has had
 * min_version updates applied, as float32 arrays. */
BNPS_EXPORT int bnps_client_pull(bnps_client* c, int64_t min_version,
                                 int n_keys, const char* const* keys,
                                 bnps_arrays** out, char* err, size_t err_len);

/* --- the worker side of the BN policy (client/worker_bn.h) --- */
typedef struct bnps_worker_bn bnps_worker_bn;

/* `policy`: "sync", "async", "local" or "recal" (INVALID_ARGUMENT else). */
BNPS_EXPORT int bnps_worker_bn_new(const char* policy, double job_bn_momentum,
                                   bnps_worker_bn** out, char* err,
                                   size_t err_len);
BNPS_EXPORT void bnps_worker_bn_free(bnps_worker_bn* r);
/* WorkerBn::CheckLayer; has_momentum 0: torch's momentum None. */
BNPS_EXPORT int bnps_worker_bn_check_layer(const bnps_worker_bn* r,
                                           const char* layer,
                                           int tracks_running,
                                           int has_momentum, double momentum,
                                           char* err, size_t err_len);
BNPS_EXPORT void bnps_worker_bn_plan_forward(const bnps_worker_bn* r,
                                             int tracks_running, int* exchange,
                                             int* want_running);
/* WorkerBn::Resolve: has_answer with the BnForward answer's moments and
 * whether it carried running statistics. What to normalize with into
 * out_*; *running_update: 0 none, 1 from the batch (bnps_update_running
 * with out_*), 2 copy the answer's running statistics. */
BNPS_EXPORT int bnps_worker_bn_resolve(
    const bnps_worker_bn* r, int64_t count, const double* mean,
    const double* m2, int64_t channels, int has_answer, int64_t answer_count,
    const double* answer_mean, const double* answer_m2,
    int answer_has_running, int64_t* out_count, double* out_mean,
    double* out_m2, int* global_backward, int* running_update, char* err,
    size_t err_len);
/* *settle: 0 nothing, 1 the workers' average (bn_local_running), 2 the
 * servers' (bn_running); FAILED_PRECONDITION under recal. */
BNPS_EXPORT int bnps_worker_bn_settle(const bnps_worker_bn* r, int* settle,
                                      char* err, size_t err_len);

/* client::UpdateRunning on the caller's running_mean/running_var and
 * *batches_tracked; has_momentum 0: the cumulative average. */
BNPS_EXPORT int bnps_update_running(int64_t count, const double* mean,
                                    const double* m2, int64_t channels,
                                    int has_momentum, double momentum,
                                    int64_t* batches_tracked,
                                    double* running_mean, double* running_var,
                                    char* err, size_t err_len);
/* merge(a, b), a first (bn::MergeInto) into out_*. */
BNPS_EXPORT int bnps_merge_moments(int64_t count_a, const double* mean_a,
                                   const double* m2_a, int64_t count_b,
                                   const double* mean_b, const double* m2_b,
                                   int64_t channels, int64_t* out_count,
                                   double* out_mean, double* out_m2, char* err,
                                   size_t err_len);

/* --- a BN layer's training step on float32 host memory ---
 * The C++ worker's CPU kernels (bn/cpu_kernels.h: moments and sums in
 * double) with the worker side of the policy in one call per pass, for
 * frontends whose tensors are float32 in host memory: x, y, dy and dx hold
 * n x channels x spatial values, contiguous in that order (spatial 1 for
 * (N, C) input; n may be 0); weight and bias are float32 vectors of
 * `channels`, NULL for ones and zeros. num_threads > 0 sets the kernels'
 * OpenMP threads for the calling thread. */

/* One training-mode forward pass of `layer` at `step` under the policy `r`:
 * the moments of x, WorkerBn::CheckLayer, PlanForward, BnForward through `c`
 * when the plan exchanges (`c` may be NULL when the policy sends nothing),
 * Resolve, client::ApplyRunning on running_mean and running_var (float32,
 * updated in place; NULL when the layer tracks none) with *batches_tracked,
 * and y = x normalized with the outcome. What it normalized with into
 * out_stats (float64, 2 x channels: the mean, then the biased variance);
 * info[0] its count, info[1] 1 once BnForward succeeded (the step is used
 * even if a later part fails), info[2] 1 if the backward pass exchanges. */
BNPS_EXPORT int bnps_layer_forward(
    const bnps_worker_bn* r, bnps_client* c, const char* layer, int64_t step,
    const float* x, int64_t n, int64_t channels, int64_t spatial,
    const float* weight, const float* bias, double eps, int has_momentum,
    double momentum, float* running_mean, float* running_var,
    int64_t* batches_tracked, int num_threads, float* y, double* out_stats,
    int64_t* info, char* err, size_t err_len);

/* bnps_layer_forward's worker side alone, for layers whose kernels run
 * elsewhere (torch operations on a GPU): from the local moments (count, and
 * float64 mean and m2 of `channels`, as bn/moments.h defines them; invalid
 * ones are INVALID_ARGUMENT), CheckLayer, PlanForward, BnForward, Resolve and
 * ApplyRunning on running_mean and running_var, here float64 host copies
 * updated in place (NULL when the layer tracks none). out_stats and info as
 * bnps_layer_forward's. One call where a frontend would otherwise make five. */
BNPS_EXPORT int bnps_layer_exchange_forward(
    const bnps_worker_bn* r, bnps_client* c, const char* layer, int64_t step,
    int64_t count, const double* mean, const double* m2, int64_t channels,
    int has_momentum, double momentum, double* running_mean,
    double* running_var, int64_t* batches_tracked, double* out_stats,
    int64_t* info, char* err, size_t err_len);

/* bnps_layer_backward's worker side alone, for layers whose kernels run
 * elsewhere: from the local sum(dy) and sum(dy * x_hat) (float64,
 * `channels`), with a non-empty `layer` their sums over the workers through
 * `c` (BnBackward at `step`), and from those the map dx = k1 dy + k2 x + k3
 * (bn::InputGradient) into k (float64, 3 x channels: k1, k2, k3) for a
 * forward that normalized with `stats` (its out_stats) over `count` samples
 * per channel, with `weight` (float64, `channels`; NULL for ones). k may be
 * NULL: the exchange alone (a pass that needs no dx). */
BNPS_EXPORT int bnps_layer_exchange_backward(
    bnps_client* c, const char* layer, int64_t step, const double* sum_dy,
    const double* sum_dy_xhat, int64_t channels, int64_t count,
    const double* stats, const double* weight, double eps, double* k,
    char* err, size_t err_len);

/* The backward pass of a forward pass that normalized with `stats`
 * (bnps_layer_forward's out_stats) over `count` samples per channel: the
 * local sum(dy) and sum(dy * x_hat) into dbias and dweight (float32; NULL:
 * not wanted); with a non-empty `layer` (the forward's info[2]) their sums
 * over the workers through `c` (BnBackward at `step`); dx from those sums
 * when dx is not NULL. */
BNPS_EXPORT int bnps_layer_backward(
    bnps_client* c, const char* layer, int64_t step, const float* dy,
    const float* x, int64_t n, int64_t channels, int64_t spatial,
    const float* weight, int64_t count, const double* stats, double eps,
    int num_threads, float* dx, float* dweight, float* dbias, char* err,
    size_t err_len);

/* bnps_layer_forward and bnps_layer_backward with their arguments in one
 * block, for frontends that call them per layer and pass: the block is made
 * once per layer and kept, the fields that stay the same (the rule, the
 * client, the name, the parameters' and buffers' addresses) are written once,
 * and each call writes only what changed (the step, the tensors' addresses
 * and shape) and passes one address instead of some twenty arguments. Each
 * field means what the argument of the same name does; has_momentum and
 * num_threads are int64_t here. */
typedef struct bnps_layer_pass {
  /* both passes */
  const bnps_worker_bn* rule; /* the forward's; unused by the backward */
  bnps_client* client;
  const char* layer;
  int64_t step;
  const float* x;
  int64_t n, channels, spatial;
  const float* weight;
  double eps;
  int64_t num_threads;
  /* the forward pass */
  const float* bias;
  int64_t has_momentum;
  double momentum;
  float* running_mean;
  float* running_var;
  int64_t* batches_tracked;
  float* y;
  double* stats; /* the forward's out_stats; the backward's stats */
  int64_t info[3]; /* the forward's info */
  /* the backward pass */
  const float* dy;
  int64_t count;
  float* dx;
  float* dweight;
  float* dbias;
} bnps_layer_pass;
BNPS_EXPORT int bnps_layer_pass_forward(bnps_layer_pass* p, char* err,
                                        size_t err_len);
BNPS_EXPORT int bnps_layer_pass_backward(const bnps_layer_pass* p, char* err,
                                         size_t err_len);

/* --- exchanges in a device stream's order (client/stream_exchanges.h) ---
 * For frontends whose kernels run on a GPU: the exchange-alone calls above
 * as jobs that run once the work queued before them on a CUDA stream is
 * done, holding the stream's later work until they return, so the host
 * queues a whole step without waiting for the device. The caller queues on
 * the stream the copy of its inputs into host memory (pinned, for
 * asynchronous copies), the job, and the copy of its outputs back.
 *
 * A job that fails writes a fallback into its outputs (the local
 * statistics; no running-statistics update) so the stream's work goes on;
 * every later job skips its exchange, and every later queueing call and
 * bnps_stream_queue_drain returns the first error (sticky). Host memory a
 * job reads or writes is the caller's and must stay valid until the job has
 * run (drain, or the stream synchronized); a job keeps its own reference to
 * the connection and to the forward's outcome (bnps_outcome). */
typedef struct bnps_stream_queue bnps_stream_queue;
typedef struct bnps_outcome bnps_outcome;

/* on_cuda 1: jobs are CUDA host functions (cuLaunchHostFunc of the driver,
 * libcuda.so.1, opened at run time; UNAVAILABLE without a CUDA driver), and
 * `stream` below is a cudaStream_t (NULL: the legacy default stream) of the
 * calling thread's current CUDA context; 0: each job runs inside the call
 * that queues it (host memory), its failure reported by the next call. */
BNPS_EXPORT int bnps_stream_queue_new(int on_cuda, bnps_stream_queue** out,
                                      char* err, size_t err_len);
/* Queued jobs still run afterwards. */
BNPS_EXPORT void bnps_stream_queue_free(bnps_stream_queue* q);
/* Waits until every queued job has run, at most timeout_s: the first error
 * of a job, DEADLINE_EXCEEDED if some have not run, or 0. */
BNPS_EXPORT int bnps_stream_queue_drain(bnps_stream_queue* q, double timeout_s,
                                        char* err, size_t err_len);
/* counts[0..2]: jobs queued and not yet run, jobs run, jobs that fell back. */
BNPS_EXPORT void bnps_stream_queue_counts(const bnps_stream_queue* q,
                                          int64_t* counts);

/* Buffers of these jobs hold float32 or float64 values (`itemsize` 4 or 8,
 * INVALID_ARGUMENT else), in the dtype of the device tensors they are
 * copied from or to, so the device converts nothing; the host computes in
 * double. */

/* Queues bnps_layer_exchange_forward's work: CheckLayer and PlanForward now
 * (their errors returned now), the rest when the job runs, from `local` (2 x
 * channels: the mean and the biased variance over `count` samples per
 * channel). The job writes into `rows` (3 x channels): what to normalize
 * with (the mean, the biased variance) and 1 / sqrt(var + eps); and, for a
 * layer that tracks running statistics (running_mean, running_var and
 * *batches_tracked: float64 host copies, NULL when it tracks none, updated
 * in place by the job), the running mean and variance after the update into
 * `running` (2 x channels) and the count of batches into *tracked_out.
 * info[0]: 1 if the job exchanges (the step is used), info[1]: 1 if the
 * backward pass exchanges. *outcome: a handle to what the job normalized
 * with, for bnps_stream_queue_backward; free it with bnps_outcome_free. */
BNPS_EXPORT int bnps_stream_queue_forward(
    bnps_stream_queue* q, void* stream, const bnps_worker_bn* r,
    bnps_client* c, const char* layer, int64_t step, int64_t count,
    const void* local, int local_itemsize, int64_t channels, double eps,
    int has_momentum, double momentum, double* running_mean,
    double* running_var, int64_t* batches_tracked, void* rows,
    int rows_itemsize, void* running, int running_itemsize,
    int64_t* tracked_out, int64_t* info, bnps_outcome** outcome, char* err,
    size_t err_len);
/* Queues bnps_layer_exchange_backward's work for the forward of `outcome`:
 * from `in` (sum(dy), sum(dy * x_hat), then with has_weight the weight;
 * `channels` each), with a non-empty `layer` their sums over the workers,
 * and the map dx = k1 dy + k2 x + k3 into k (3 x channels, k_itemsize;
 * NULL: the exchange alone). Nothing is queued when there is nothing to do
 * (no layer, no k). */
BNPS_EXPORT int bnps_stream_queue_backward(
    bnps_stream_queue* q, void* stream, bnps_client* c, const char* layer,
    int64_t step, const void* in, int in_itemsize, int has_weight,
    int64_t channels, const bnps_outcome* outcome, double eps, void* k,
    int k_itemsize, char* err, size_t err_len);
BNPS_EXPORT void bnps_outcome_free(bnps_outcome* o);

/* The host waiting for the device around a queue: waits[0] counts the
 * frontend's own waits (each noted with bnps_stream_queue_note_wait: a
 * layer that read device values outside the queue), waits[1] the
 * bnps_stream_queue_drain calls that found jobs not yet run and waited.
 * libbnps itself never synchronizes a stream or the device. */
BNPS_EXPORT void bnps_stream_queue_waits(const bnps_stream_queue* q,
                                         int64_t* waits);
BNPS_EXPORT void bnps_stream_queue_note_wait(bnps_stream_queue* q);
/* Seconds the queue's jobs spent in their exchanges so far (the calls to
 * the servers, barriers included, and what follows on the host), summed. */
BNPS_EXPORT double bnps_stream_queue_exchange_seconds(
    const bnps_stream_queue* q);

/* The tests' stand-in for a CUDA stream that captures a graph: a queue on
 * host memory (as on_cuda 0) whose copies and jobs, while recording, are
 * recorded instead of run (the device passes see a capturing stream);
 * bnps_stream_queue_record then sets recording `on` or off and runs
 * everything recorded `replays` more times, in order, as replays of the
 * graph would (the memory the copies name must stay valid).
 * FAILED_PRECONDITION on another queue. */
BNPS_EXPORT int bnps_stream_queue_new_recording(bnps_stream_queue** out,
                                                char* err, size_t err_len);
BNPS_EXPORT int bnps_stream_queue_record(bnps_stream_queue* q, int on,
                                         int replays, char* err,
                                         size_t err_len);

/* --- device layer passes: one call per layer pass on a device stream ---
 * For frontends whose BN kernels run on a GPU around one native call per
 * pass (bnps.torch on CUDA: torch's batch_norm_stats, batch_norm_elemt,
 * batch_norm_backward_reduce and batch_norm_backward_elemt, the kernels
 * torch's own SyncBatchNorm uses). Each call queues on `stream`, and
 * returns without waiting for it: the copies of the local statistics into
 * the pass's pinned host buffers, the exchange as a job of the queue
 * (bnps_stream_queue_forward's rules, from the same client::WorkerBn), and
 * the copies of its results into the caller's device memory. On a queue
 * made with on_cuda 0, "device" memory is host memory and everything runs
 * inside the call (the same code: the CPU tests').
 *
 * Values. The statistics, rows and sums hold float32 or float64 values
 * (`itemsize` 4 or 8), the running buffers `running_itemsize`-byte ones;
 * the host computes in double. Every device address names memory of the
 * stream's device, contiguous.
 *
 * State. A pass keeps the layer's running statistics as a float64 host
 * copy (given at creation: read them from the device before, once) and its
 * step counters; the jobs update both when they RUN, so a job captured in
 * a CUDA graph (queued while the stream captures: cuStreamIsCapturing)
 * makes a new step at every replay of the graph. Its pinned buffers are
 * reused by every pass, which the stream's order makes safe: a layer's
 * passes must all be queued on one stream. The buffers stay allocated
 * until the queue is freed; the pass must not outlive the queue, nor may a
 * graph that captured its jobs be replayed after the queue is freed.
 *
 * Failures are the queue's: a failed job writes the local statistics (no
 * running-statistics update) or leaves the local sums, later jobs skip
 * their exchange, and the next call on the queue or its drain returns the
 * first error. */
typedef struct bnps_device_pass bnps_device_pass;

/* A layer's passes through `q` under rule `r` and client `c` (needed where
 * the policy exchanges): `channels`, `eps`, the momentum, the statistics'
 * itemsize; with running statistics (running_mean not NULL) their host
 * copies (float64, `channels` each, and *batches_tracked) and the device
 * buffers the forward passes write them to (running_mean_out and
 * running_var_out, `running_itemsize`-byte values, and batches_tracked_out,
 * an int64); `step` and `backward_step`, the next steps of its forward and
 * backward exchanges. CheckLayer's errors now; FAILED_PRECONDITION while
 * the stream captures a graph (the first pass of a layer runs eagerly);
 * UNAVAILABLE, saying why, where the CUDA driver lacks the calls. */
BNPS_EXPORT int bnps_device_pass_new(
    bnps_stream_queue* q, const bnps_worker_bn* r, bnps_client* c,
    const char* layer, int64_t channels, double eps, int has_momentum,
    double momentum, int itemsize, const double* running_mean,
    const double* running_var, const int64_t* batches_tracked,
    void* running_mean_out, void* running_var_out, int running_itemsize,
    void* batches_tracked_out, int64_t step, int64_t backward_step,
    bnps_device_pass** out, char* err, size_t err_len);
/* Queued jobs keep what they use. */
BNPS_EXPORT void bnps_device_pass_free(bnps_device_pass* p);
/* steps[0], steps[1]: the next forward and backward step, as the jobs that
 * have run left them. */
BNPS_EXPORT void bnps_device_pass_steps(const bnps_device_pass* p,
                                        int64_t* steps);
/* A layer's device passes, their arguments in one block (as bnps_layer_pass
 * is for the layer steps): the block is made once per layer and kept, `pass`
 * written once, and each call writes only what changed and passes one
 * address.
 *
 * bnps_device_call_forward: a forward pass over `count` (>= 1) samples per
 * channel whose local statistics are `mean` and `invstd` (device,
 * `channels` each: the mean and 1 / sqrt(biased variance), batch_norm_stats
 * with eps 0; inf for a constant channel). It queues on `stream` their copy
 * out, the exchange, and the copies of what to normalize with back into
 * `mean` and `invstd` (1 / sqrt(var + eps); in the stream's order, after
 * their copy out, so those buffers must be the caller's to overwrite:
 * batch_norm_stats's outputs are), of the samples it describes into
 * *count_out (device, an int32) and of the running statistics into the
 * layer's buffers. It sets `exchanges` (1 if the pass exchanges: its step
 * is used), `backward_exchanges` (1 if its backward pass does) and
 * `captured` (1 if the stream captures a graph: the job is kept for its
 * replays).
 *
 * bnps_device_call_backward: the backward pass of a forward that normalized
 * with `invstd`: where the policy's backward exchanges, queues the copies
 * of sum_dy and sum_dy_xmu (device, `channels` each: sum(dy) and
 * sum(dy * (x - mean)), batch_norm_backward_reduce's), their sums over the
 * workers, and the copies back into them; else nothing. */
typedef struct bnps_device_call {
  bnps_device_pass* pass;
  void* stream;
  /* the forward pass */
  int64_t count;
  void* mean;
  void* invstd; /* the backward's too */
  void* count_out;
  int64_t exchanges;
  int64_t backward_exchanges;
  int64_t captured;
  /* the backward pass */
  void* sum_dy;
  void* sum_dy_xmu;
} bnps_device_call;
BNPS_EXPORT int bnps_device_call_forward(bnps_device_call* a, char* err,
                                         size_t err_len);
BNPS_EXPORT int bnps_device_call_backward(const bnps_device_call* a,
                                          char* err, size_t err_len);

/* --- the export (client/job_reader.h, client/state_export.h) --- */

/* Reads every shard of `servers` (comma-separated, shard order) without
 * joining the job and writes the parameters and BN running statistics as
 * safetensors to `path`, as bnps_status --export does. Writes a JSON object
 * {"step", "job_complete", "parameters", "bn_layers"} into `json` (`len`
 * bytes). Empty strings leave the token and TLS off. */
BNPS_EXPORT int bnps_export(const char* servers, const char* path,
                            const char* job, const char* token_file,
                            const char* tls_ca, const char* tls_cert,
                            const char* tls_key, double timeout_s, char* json,
                            size_t len, char* err, size_t err_len);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* BNPS_PYTHON_NATIVE_BNPS_C_H_ */
