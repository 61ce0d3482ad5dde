"""bnps.torch.ParameterServerOptimizer: trains a PyTorch model's parameters
on the bnps servers, with the servers' optimizer (SGD with the job's
learning rate, momentum and weight decay: bnps_server's flags).

    opt = bnps.torch.ParameterServerOptimizer(model.named_parameters())
    for x, y in loader:
        with connection.step():
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)   # a mean over the batch
            loss.backward()
            opt.step(num_samples=len(x))

Construction offers every worker's initial values (the first to arrive wins)
and loads the winner, so all workers start alike. step() pushes this
worker's gradients as a sum over its samples (multiplied by num_samples when
loss_reduction="mean"; the servers divide by the global batch) and
loads the parameters for the next step: under sync, local and recal once
every worker's step is applied (a barrier); under async the newest.
Parameters are float32 on the servers; a float64 model is rounded.

Uneven batches with synchronized BN: use a sum loss (reduction="sum",
loss_reduction="sum"). A per-worker mean scales each worker's dy by its own
1/n inside the BN backward pass, which mixes all workers' dy, so the result is
exact only when every worker has the same batch size (as with
torch.nn.SyncBatchNorm under DDP).
"""

import torch

from bnps.torch import connection as _connection


class ParameterServerOptimizer:
    def __init__(self, named_parameters, connection=None, prefix="",
                 loss_reduction="mean"):
        if loss_reduction not in ("mean", "sum"):
            raise ValueError("loss_reduction must be 'mean' or 'sum'")
        self.connection = connection or _connection.default_connection()
        self.params = {prefix + n: p for n, p in named_parameters}
        if not self.params:
            raise ValueError("ParameterServerOptimizer: no parameters")
        self.loss_reduction = loss_reduction
        self.step_count = 0
        self._bulk = self.connection.gradients != "async"
        self.connection.client.init_parameters(
            {n: p.detach().float().cpu().numpy()
             for n, p in self.params.items()})
        self._load(0)

    def zero_grad(self, set_to_none=True):
        for p in self.params.values():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def _load(self, min_version):
        values = self.connection.client.pull_parameters(min_version,
                                                     list(self.params))
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(torch.from_numpy(values[n]).view_as(p))

    def step(self, num_samples):
        """Pushes the gradients of this worker's `num_samples` samples
        (parameters without a gradient push zeros) and loads the next
        parameters."""
        # A queued BN exchange that failed made these gradients with local
        # statistics: raise it rather than push them.
        self.connection.drain_exchanges()
        scale = float(num_samples) if self.loss_reduction == "mean" else 1.0
        grads = {}
        for n, p in self.params.items():
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            grads[n] = (g.detach().float() * scale).cpu().numpy()
        self.connection.client.push_gradients(self.step_count, int(num_samples),
                                           grads)
        self.step_count += 1
        self._load(self.step_count if self._bulk else 0)
