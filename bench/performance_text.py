"""The prose of docs/performance.md: the introduction, and for each table
what it measures (WHAT, shown above it) and how to read it (READING, shown
under it). update_performance_md.py puts them around the tables it renders.
"""

import step_overhead

INTRO = """\
This file is generated: do not edit it by hand. It holds the tables of one
run of the project's benchmarks, all on the machine described below. Absolute
times on a shared machine are noise from one run to the next, so every table
sets bnps against a peer measured in the same run on the same machine, and
the figure to read is the ratio between them:

- **BN-sync round trip** (`ps_benchmark`): the latency of one BN layer's
  synchronous exchange among W worker processes, against gloo's allreduce
  and against bare gRPC moving the same bytes.
- **Gradient push + pull** (`ps_benchmark`): one worker pushing a gradient to
  S shard servers and pulling the parameters back, against bare gRPC moving
  the same bytes.
- **CPU BN kernels** (`bn_benchmark`): the BN kernels' bandwidth against a
  memcpy moving as many bytes.
- **Optimizer step** (`optimizer_benchmark`): the server's SGD step against a
  memcpy moving as many bytes.
- **Step overhead** (`step_overhead.py`): the training step of each policy
  with real servers and workers, against local BN in the same run, beside
  the BN round trip.

Everything runs on 127.0.0.1; there is no network between the processes.
"""

# What each table measures, shown above it.
WHAT = {
    "bn_sync": """\
Each of W worker processes sends one BN layer's statistics (count, mean[C]
and M2[C]: 16C + 8 bytes) and waits for the merge of all W, as the `sync`
policy does for every BN layer in every step. **bnps**: one shard server;
each worker calls `PsClient::BnForward` back to back on its own client,
the BN traffic over raw TCP as the launcher runs it (`--bn_port`).
The peers move the same bytes per worker: **gloo** is a ring allreduce of 2C
doubles over TCP (what an allreduce-based SyncBN exchanges); **echo** is a
bare gRPC bidi stream per worker whose server sends each message straight
back (the transport, with no barrier); **star** is the same bare gRPC server
answering a round only once all W streams have sent theirs (a barrier over
gRPC that does no work); **tcp** is that barrier on raw loopback TCP, one
connection per worker and one epoll thread, without gRPC (the floor under
any barrier over TCP here). Cells are microseconds: for each worker the median
(p50) and 99th percentile (p99) of its calls, the largest over the workers,
then the median over the rounds.""",
    "grad": """\
One worker pushes a gradient of 1, 16 or 64 MB, split into parameters of at
most 1M floats that are spread over S shard servers by key, and pulls the
updated parameters back (`PushGradients` then `PullParametersInto`; with one
worker in a `sync` job the update is applied at once). **echo** moves the
same bytes over bare gRPC in 1 MiB messages, up in a client-streaming call
and down in a server-streaming one, to S servers in parallel. Each system's
repetitions run in a fresh process. Both systems run with the same heap
settings: each process keeps freed memory for reuse (`--heap_keep_mb=256`,
the default of `bnps_server` and `bnps_worker` too), so that gRPC's read
buffers, freed and taken again with every message, are not handed back to
the kernel and faulted in again as fresh pages; `ps_benchmark
--heap_keep_mb=0` measures both with glibc's defaults. MB/s is 2 x payload
over the median time of one push + pull (MB = 2^20 bytes).""",
    "bn_kernels": """\
The CPU BN kernels, one thread (`OMP_NUM_THREADS=1`), on two NCHW float
shapes. GB/s counts the bytes a kernel must move (each input read once, each
output written once) over its median time; memcpy GB/s is a copy moving as
many bytes, timed in the same run; ratio is the first over the second.""",
    "optimizer": """\
The server's optimizer step: `ParameterStore::Push` for the one worker of a
bulk-synchronous job, which applies SGD with momentum and weight decay at
once and moves 20 bytes per element (gradient, weights and momentum read;
weights and momentum written). It runs on every core, against a memcpy of as
many bytes split over the cores the same way, timed in the same run.""",
    "step_overhead": step_overhead.DOC_WHAT,
}

# How to read each table: the template, then figures from the table.
READING = {
    "bn_sync": """\
A ratio is the p50 of the first system over the p50 of the second: below 1
the first is faster, above 1 slower. bnps/gloo compares bnps's barrier with
gloo's allreduce; bnps/star sets bnps (its work: checking the request,
the Chan merge in double precision, its bookkeeping) against a gRPC
barrier that does none; star/gloo compares that bare barrier with gloo.
bnps/echo sets the barrier against a transport that waits for nobody.
star/tcp is what gRPC itself (HTTP/2 framing, its threads and wake-ups)
costs over the same barrier on raw loopback TCP; bnps/tcp, both on raw TCP,
is what bnps's own work costs over that floor. With
W = 1 gloo's allreduce is a local copy, so it has no ratio. A `*` marks a row
that ran out of time before its minimum number of calls. The p99 columns
show the tail of the same calls; the ratios are of p50s only.""",
    "grad": """\
bnps/echo above 1 means bnps moved the bytes faster than bare gRPC did;
below 1, it is the fraction of the bare transport's rate that bnps reaches
while also applying the update on the server. "keys per shard" shows how the
parameters fall on the servers: a 1 MB gradient is a single parameter, so
with S = 2 one server holds all of it.

Where the time goes: bnps puts tensors into messages by reference (the
caller's gradients on a push, the store's values on a pull), and the
receiver copies each chunk once, from gRPC's buffers to where it belongs
(the server's staging buffer, the caller's tensor), checking on the way that
its values are finite; the server applies SGD to each tensor once it is
complete. Profiled at 64 MB with S = 1, about half of the CPU time is the
kernel's TCP over loopback (copying into and out of the sockets, and the
stack around that), a seventh those receive-side copies, a tenth the
optimizer and a tenth waking threads; gRPC's own work is about a twentieth.
The echo makes the same kernel copies, and copies each message into and out
of its protobuf message besides. With glibc's default heap settings freed
buffers go back to the kernel: page faults then took about a fifth of
bnps's CPU time and more of the echo's.""",
    "bn_kernels": """\
A ratio of 1 means a kernel moves its bytes as fast as a plain copy of as
many bytes on one thread of this machine; below 1, it is the fraction of the
copy's rate the kernel reaches. The copy is a reference measured in the
same run, not a hard limit, so a ratio can exceed 1. The two shapes hold the
same number of elements with different channel counts.""",
    "optimizer": """\
SGD/memcpy is the fraction of a parallel copy's bandwidth that the
optimizer step reaches: near 1 the step is bound by memory, as an
elementwise update should be. A copy's stores may also read each
destination line first, which the step, writing lines it has just read,
does not, so the ratio leans toward the step and can exceed 1. The shortest
steps (the smaller sizes) are the most exposed to a shared machine's
noise.""",
    "step_overhead": step_overhead.DOC_READING,
}
