"""One worker process of pytorch_parity_test.py: connects with
bnps.torch.init() (BNPS_* environment), runs one scenario with
bnps.torch.SyncBatchNorm on its slice of each case's data, and saves what it
saw (outputs, gradients, running statistics, errors) with torch.save to
OUT/<scenario>_w<worker>.pt for the test to compare.

    parity_worker.py SCENARIO OUT

or, the same, run_forked() in a process forked from a server that has
imported torch already (the test's way: a worker starts in milliseconds).
"""

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity_cases  # noqa: E402
import bnps  # noqa: E402
import bnps.torch  # noqa: E402


# BNPS_PARITY_DEVICE=cuda runs the layer on the GPU (tools/gpu/run.sh torch);
# what is saved comes back to the CPU, where the test compares it.
DEVICE = torch.device(os.environ.get("BNPS_PARITY_DEVICE", "cpu"))


def run_case(case, worker, eval_extra=0):
    """Trains a standalone layer on the worker's slice for case.steps steps;
    returns per-step outputs and gradients and the final state."""
    bn = bnps.torch.SyncBatchNorm(case.features, affine=case.affine,
                                  track_running_stats=case.track,
                                  name=case.name)
    param_dtype = torch.float64 if case.dtype == torch.float64 else torch.float32
    bn = bn.to(device=DEVICE, dtype=param_dtype)
    if case.affine:
        w, b = case.init_params()
        with torch.no_grad():
            bn.weight.copy_(w)
            bn.bias.copy_(b)
    rows = case.slice(worker)
    out = {"y": [], "dx": [], "dw": [], "db": [], "channels_last": []}
    for step in range(case.steps):
        x, dy = case.global_data(step)
        x = x[rows].to(device=DEVICE, dtype=case.dtype)
        if case.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        x.requires_grad_(True)
        y = bn(x)
        (y.to(torch.float64) * dy[rows].to(DEVICE)).sum().backward()
        out["y"].append(y.detach().to(torch.float64).cpu())
        out["dx"].append(x.grad.detach().to(torch.float64).cpu())
        out["channels_last"].append(
            y.is_contiguous(memory_format=torch.channels_last))
        if case.affine:
            out["dw"].append(bn.weight.grad.detach().to(torch.float64).cpu().clone())
            out["db"].append(bn.bias.grad.detach().to(torch.float64).cpu().clone())
            bn.weight.grad = None
            bn.bias.grad = None
        out["dtype"] = str(y.dtype)
    if case.track:
        out["running_mean"] = bn.running_mean.detach().to(torch.float64).cpu().clone()
        out["running_var"] = bn.running_var.detach().to(torch.float64).cpu().clone()
        out["num_batches_tracked"] = int(bn.num_batches_tracked)
    bn.eval()
    xe = parity_cases.eval_data(case)[rows].to(device=DEVICE, dtype=case.dtype)
    with torch.no_grad():
        out["y_eval"] = bn(xe).to(torch.float64).cpu()
        for _ in range(eval_extra):  # only some workers: eval never syncs
            bn(xe)
    return out


def scenario_sync(worker):
    return {case.name: run_case(case, worker, eval_extra=3 if worker == 0 else 0)
            for case in parity_cases.SYNC3}


SECURED = parity_cases.Case("secured", [3, 2], 3, steps=2, seed=13)


def scenario_secured(worker):
    """Mutual TLS and a job token, from BNPS_TLS_* and BNPS_TOKEN_FILE."""
    return {"secured": run_case(SECURED, worker)}


def scenario_shared(worker):
    """One layer applied to two batches per step, one loss over both; in
    float64, or BNPS_PARITY_DTYPE."""
    case = parity_cases.SHARED
    dtype = getattr(torch, os.environ.get("BNPS_PARITY_DTYPE", "float64"))
    bn = bnps.torch.SyncBatchNorm(case.features, name=case.name).to(dtype)
    w, b = case.init_params()
    with torch.no_grad():
        bn.weight.copy_(w)
        bn.bias.copy_(b)
    rows = case.slice(worker)
    out = {"y": [], "dx": []}
    for step in range(case.steps):
        x1, dy1, x2, dy2 = (t[rows].to(dtype)
                            for t in parity_cases.shared_data(step))
        x1.requires_grad_(True)
        x2.requires_grad_(True)
        y1, y2 = bn(x1), bn(x2)
        ((y1 * dy1).sum() + (y2 * dy2).sum()).backward()
        out["y"].append((y1.detach().double(), y2.detach().double()))
        out["dx"].append((x1.grad.double(), x2.grad.double()))
    out["running_mean"] = bn.running_mean.double()
    out["running_var"] = bn.running_var.double()
    return out


def scenario_long(worker):
    out = run_case(parity_cases.LONG, worker)
    client = bnps.torch.default_connection().client
    mean, var = client.bn_running("long", parity_cases.LONG.features)
    out["server_mean"] = torch.from_numpy(mean)
    out["server_var"] = torch.from_numpy(var)
    return {"long": out}


def scenario_convert(worker):
    model = parity_cases.nested_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model = bnps.torch.convert_sync_batchnorm(model)
    out = {"names": sorted(m.bnps_name for m in model.modules()
                           if isinstance(m, bnps.torch.SyncBatchNorm)),
           "types": sorted({type(m).__name__ for m in model.modules()}),
           "state_kept": all(torch.equal(before[k], v)
                             for k, v in model.state_dict().items()),
           "same_keys": sorted(before) == sorted(model.state_dict()),
           "y": [], "dx": [], "grads": []}
    start = sum(parity_cases.CONVERT_SIZES[:worker])
    rows = slice(start, start + parity_cases.CONVERT_SIZES[worker])
    for step in range(parity_cases.CONVERT_STEPS):
        x, dy = parity_cases.convert_data(step)
        x = x[rows].clone().requires_grad_(True)
        y = model(x)
        (y * dy[rows]).sum().backward()
        out["y"].append(y.detach())
        out["dx"].append(x.grad.detach())
        out["grads"].append({n: p.grad.detach().clone()
                             for n, p in model.named_parameters()})
        model.zero_grad(set_to_none=True)
    out["buffers"] = {k: v.clone() for k, v in model.state_dict().items()}
    return out


def meet_at(out_dir, worker, workers, timeout_s=120):
    """Waits (bounded) until every worker has called this: each leaves a file
    in out_dir and polls for the others'."""
    open(os.path.join(out_dir, f"ready_w{worker}"), "w").close()
    deadline = time.monotonic() + timeout_s
    while not all(os.path.exists(os.path.join(out_dir, f"ready_w{w}"))
                  for w in range(workers)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"worker {worker}: the others never came")
        time.sleep(0.01)


def scenario_stop(worker):
    """Worker 1 stops calling after 2 steps (its process stays up and
    heartbeating); worker 0 goes on and must get an error, not hang."""
    bn = bnps.torch.SyncBatchNorm(3, name="stop").to(DEVICE, torch.float64)
    x = torch.randn(4, 3, 2, 2, dtype=torch.float64).to(DEVICE)
    out = {"completed": 0, "error": None}
    # Both workers meet before step 0, so the job's short barrier timeout
    # measures worker 1 stopping, not how long each took to import torch.
    meet_at(sys.argv[2], worker, 2)
    steps = 2 if worker == 1 else 4
    start = time.monotonic()
    try:
        for _ in range(steps):
            start = time.monotonic()
            bn(x).sum().backward()
            # Where the exchanges are queued on the stream, a failed one is
            # raised here (as Connection.step() and the optimizer do).
            bnps.torch.default_connection().drain_exchanges()
            out["completed"] += 1
    except bnps.BnpsError as e:
        out["error"] = type(e).__name__
        out["message"] = str(e)
        out["is_timeout"] = isinstance(e, TimeoutError)
        out["waited_s"] = time.monotonic() - start
    if worker == 1:
        time.sleep(float(os.environ.get("STOP_SLEEP_S", "6")))
    return out


def scenario_local(worker):
    """local: training normalizes with the worker's own batch; afterwards
    sync_running_stats averages the running statistics."""
    case = parity_cases.Case("local", [4, 6], 3, steps=5, seed=20)
    out = run_case_keep(case, worker)
    bn = out.pop("module")
    out["settled"] = bnps.torch.sync_running_stats(bn)
    out["running_after"] = running(bn)
    # A second round after more training (each round is averaged anew).
    for step in range(2):
        x, _ = case.global_data(50 + step)
        bn(x[case.slice(worker)].to(DEVICE) * (1 + worker))
    out["running_before2"] = running(bn)
    bnps.torch.sync_running_stats(bn)
    out["running_after2"] = running(bn)
    return out


def running(bn):
    """The layer's running statistics, on the CPU."""
    return (bn.running_mean.cpu().clone(), bn.running_var.cpu().clone())


def run_case_keep(case, worker):
    bn = bnps.torch.SyncBatchNorm(case.features, name=case.name).to(
        DEVICE, torch.float64)
    rows = case.slice(worker)
    out = {"y": []}
    for step in range(case.steps):
        x, dy = case.global_data(step)
        y = bn(x[rows].to(DEVICE))
        (y * dy[rows].to(DEVICE)).sum().backward()
        out["y"].append(y.detach().cpu())
    out["running_before"] = running(bn)
    out["module"] = bn
    return out


def scenario_recal(worker):
    """recal: local while training, then recalibrate over each worker's own
    batches (different numbers of batches per worker)."""
    case = parity_cases.Case("recal", [4, 6], 3, steps=2, seed=21)
    out = run_case_keep(case, worker)
    bn = out.pop("module")
    loader = [parity_cases.Case("recal", [5, 3], 3, seed=30 + worker)
              .global_data(b)[0] for b in range(2 + worker)]
    out["batches"] = bnps.torch.recalibrate(bn, [b.to(DEVICE) for b in loader])
    out["running_mean"], out["running_var"] = running(bn)
    out["loader"] = loader
    # A second recalibration, on other data (a round of its own).
    loader2 = [b * 2 + 5 for b in loader[:1 + worker]]
    bnps.torch.recalibrate(bn, [b.to(DEVICE) for b in loader2])
    out["running2"] = running(bn)
    out["loader2"] = loader2
    return out


def scenario_async(worker):
    """async: runs inside connection.step() and ends with the servers' stats."""
    connection = bnps.torch.default_connection()
    bn = bnps.torch.SyncBatchNorm(3, name="async").to(DEVICE, torch.float64)
    g = torch.Generator().manual_seed(40 + worker)
    for _ in range(6):
        with connection.step():
            x = torch.randn(5, 3, 2, 2, generator=g,
                            dtype=torch.float64) + 3 * worker
            y = bn(x.to(DEVICE))
            y.sum().backward()
    bnps.torch.sync_running_stats(bn)
    mean, var = running(bn)
    return {"finite": bool(torch.isfinite(y).all()),
            "running_mean": mean, "running_var": var,
            "steps": int(bn.num_batches_tracked)}


def scenario_optimizer(worker):
    """A model trained through the servers' SGD (uneven batches)."""
    model = bnps.torch.convert_sync_batchnorm(parity_cases.opt_model())
    # A sum loss: with uneven batches a per-worker mean would weigh the
    # workers' dy differently inside the synchronized BN backward pass.
    opt = bnps.torch.ParameterServerOptimizer(model.named_parameters(),
                                              loss_reduction="sum")
    connection = bnps.torch.default_connection()
    sizes = parity_cases.OPT_SIZES
    rows = slice(sum(sizes[:worker]), sum(sizes[:worker + 1]))
    for step in range(parity_cases.OPT_STEPS):
        x, y = parity_cases.opt_data(step)
        with connection.step():
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[rows]), y[rows],
                                                     reduction="sum")
            loss.backward()
            opt.step(num_samples=sizes[worker])
    return {"params": {n: p.detach().clone()
                       for n, p in model.named_parameters()},
            "steps": opt.step_count}


def scenario_running(worker):
    """One worker: a layer with the cumulative average (momentum None)
    beside torch's; half-way its state is loaded from torch's layer (the
    buffers change under it), then trained on."""
    torch.manual_seed(5)
    bn = bnps.torch.SyncBatchNorm(3, momentum=None, name="running").to(
        DEVICE, torch.float64)
    ref = torch.nn.BatchNorm2d(3, momentum=None).to(DEVICE, torch.float64)
    out = {"y": [], "y_ref": []}
    for step in range(6):
        if step == 3:
            ref.running_mean.add_(1.0)  # a state of its own to load
            bn.load_state_dict(ref.state_dict())
        x = (torch.randn(4, 3, 2, 2, dtype=torch.float64) * (step + 1)).to(
            DEVICE)
        y = bn(x)
        y.sum().backward()
        out["y"].append(y.detach().cpu())
        out["y_ref"].append(ref(x).detach().cpu())
    bnps.torch.default_connection().drain_exchanges()
    for name, t in bn.state_dict().items():
        out[name] = t.cpu()
        out["ref_" + name] = ref.state_dict()[name].cpu()
    return out


def scenario_overflow(worker):
    """Mixed precision's overflow step: at step 1 worker 0's loss is scaled
    to infinity (as a GradScaler's too-large scale does). Per step and
    layer (float32, which takes the native steps on the CPU, and float64):
    whether x's gradient and the weight's are finite, and the running
    statistics at the end."""
    torch.manual_seed(7 + worker)
    out = {}
    for dtype in (torch.float32, torch.float64):
        name = str(dtype)[6:]
        bn = bnps.torch.SyncBatchNorm(3, name="overflow_" + name).to(
            DEVICE, dtype)
        finite = []
        for step in range(3):
            x = torch.randn(4, 3, 2, 2, dtype=dtype, device=DEVICE,
                            requires_grad=True)
            scale = float("inf") if step == 1 and worker == 0 else 1.0
            bn.zero_grad()
            (bn(x) * scale).sum().backward()
            finite.append((bool(torch.isfinite(x.grad).all()),
                           bool(torch.isfinite(bn.weight.grad).all())))
        bnps.torch.default_connection().drain_exchanges()
        out[name] = finite
        out[name + "_running"] = bool(torch.isfinite(bn.running_var).all())
    return out


SCENARIOS = {name[len("scenario_"):]: fn for name, fn in globals().items()
             if name.startswith("scenario_")}


def main():
    scenario, out_dir = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    with bnps.torch.init() as connection:
        result = SCENARIOS[scenario](connection.worker)
        if isinstance(result, dict):  # jobs of the queued exchanges, if any
            result["stream_counts"] = {
                "cuda" if on_cuda else "host": q.counts()
                for on_cuda, q in connection._queues.items()}
    torch.save(result, os.path.join(out_dir, f"{scenario}_w{connection.worker}.pt"))


def run_forked(scenario, out_dir, env, log_path):
    """main() for SCENARIO and OUT in a forked process: `env` becomes the
    whole environment, and what it prints goes to `log_path`."""
    os.environ.clear()
    os.environ.update(env)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.argv = [__file__, scenario, out_dir]
    main()


if __name__ == "__main__":
    main()
