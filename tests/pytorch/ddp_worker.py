"""One process of ddp_test.py: DistributedDataParallel (gloo) for the
gradients, bnps.torch.SyncBatchNorm for BN. The test sets torchrun's
variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and BNPS_SERVERS
only, so bnps.torch.init() takes the worker id from RANK. Trains the model
of ddp_cases on this rank's slice of each global batch with torch SGD and
saves what it saw to OUT/<scenario>_w<rank>.pt.

    ddp_worker.py SCENARIO OUT     SCENARIO: sync, sync_broadcast, local,
                                   async, recal
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_cases  # noqa: E402
import bnps.torch  # noqa: E402


def main():
    scenario, out_dir = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    connection = bnps.torch.init()
    rank, world = dist.get_rank(), dist.get_world_size()
    assert (connection.worker, connection.num_workers) == (rank, world)
    model = bnps.torch.convert_sync_batchnorm(ddp_cases.model())
    # DDP's buffer broadcast copies rank 0's running statistics into every
    # rank before each forward: harmless under sync (they are equal),
    # wrong for local (each worker's own until sync_running_stats).
    ddp = DDP(model, broadcast_buffers=(scenario == "sync_broadcast"))
    opt = torch.optim.SGD(ddp.parameters(), lr=ddp_cases.LR)
    rows = ddp_cases.rows(rank)
    out = {"loss": [], "y": []}
    for step in range(ddp_cases.STEPS):
        x, y = ddp_cases.data(step)
        with connection.step():
            opt.zero_grad()
            logits = ddp(x[rows])
            loss = torch.nn.functional.cross_entropy(logits, y[rows])
            loss.backward()
            opt.step()
        out["loss"].append(float(loss))
        out["y"].append(logits.detach())
    if connection.policy == "recal":
        out["recalibrated"] = bnps.torch.recalibrate(
            model, [ddp_cases.data(s)[0][rows] for s in range(2)])
    elif connection.policy in ("local", "async"):
        out["settled"] = bnps.torch.sync_running_stats(model)
    out["state"] = {k: v.detach().clone()
                    for k, v in model.state_dict().items()}
    connection.close()
    dist.destroy_process_group()
    torch.save(out, os.path.join(out_dir, f"{scenario}_w{rank}.pt"))


if __name__ == "__main__":
    main()
