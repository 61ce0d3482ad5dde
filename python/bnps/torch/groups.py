"""torch process groups as bnps BN groups.

torch.nn.SyncBatchNorm normalizes over the ranks of a `process_group`;
bnps normalizes over a BN group of the job: K consecutive worker ids
(0..K-1, K..2K-1, ...), K the servers' --bn_group_size (0: the whole job).
This module only translates one into the other: a torch group maps to a
bnps group when it is such a block (torch rank = bnps worker id), and says
clearly what bnps supports when it is not. The servers hold the rule itself
(which workers merge with which)."""

SUPPORTED = ("bnps normalizes over blocks of K consecutive worker ids "
             "(ranks 0..K-1, K..2K-1, ...; every block the same size K, "
             "K dividing the number of workers), the servers' "
             "--bn_group_size=K")


def group_size_of_ranks(ranks, worker, num_workers):
    """The bnps group size K for the torch group of `ranks` (the global
    ranks in it, torch rank = bnps worker id) seen from `worker` of a job of
    `num_workers`: K = len(ranks) when the ranks are the block of K
    consecutive ids holding `worker`, starting at a multiple of K, K
    dividing num_workers; 0 when the group is the whole job. ValueError,
    saying what bnps supports, otherwise."""
    ranks = sorted(int(r) for r in ranks)
    k = len(ranks)
    if k == 0 or len(set(ranks)) != k:
        raise ValueError(f"bnps SyncBatchNorm: process_group ranks {ranks} "
                         f"are not a group: {SUPPORTED}")
    if worker not in ranks:
        raise ValueError(f"bnps SyncBatchNorm: worker {worker} is not in its "
                         f"process_group (ranks {ranks}): each process must "
                         f"pass the group it belongs to")
    if k == num_workers and ranks == list(range(num_workers)):
        return 0
    contiguous = ranks == list(range(ranks[0], ranks[0] + k))
    if not contiguous or ranks[0] % k != 0 or num_workers % k != 0 or \
            ranks[-1] >= num_workers:
        raise ValueError(f"bnps SyncBatchNorm: process_group ranks {ranks} "
                         f"of {num_workers} workers is not supported: "
                         f"{SUPPORTED}")
    return k


def process_group_ranks(process_group):
    """The global ranks of a torch.distributed process group (None: the
    whole world, returned as None)."""
    if process_group is None:
        return None
    import torch.distributed as dist
    if hasattr(dist, "get_process_group_ranks"):  # torch >= 2.0
        return list(dist.get_process_group_ranks(process_group))
    from torch.distributed import distributed_c10d as c10d  # torch 1.x
    return list(c10d._pg_group_ranks[process_group].keys())


def check_process_group(process_group, connection):
    """Raises ValueError unless `process_group` (torch's, or None: the whole
    job) maps to the BN groups `connection`'s servers run
    (config["bn_group_size"], 0: none)."""
    servers = int(connection.config.get("bn_group_size", 0))
    ranks = process_group_ranks(process_group)
    mine = 0 if ranks is None else group_size_of_ranks(
        ranks, connection.worker, connection.num_workers)
    if mine != servers:
        raise ValueError(
            f"bnps SyncBatchNorm: process_group means BN groups of "
            f"{mine or connection.num_workers} workers, but the servers run "
            f"--bn_group_size={servers} (0: the whole job of "
            f"{connection.num_workers}); start them with "
            f"--bn_group_size={mine}")
