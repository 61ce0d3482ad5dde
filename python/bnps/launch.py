"""Where this process sits in the job, from the launchers' variables: its
worker id, the number of workers, its rank on its node. Pure Python (no torch,
no compiled module); bnps.torch.init() calls it.

    p = bnps.launch.placement()     # os.environ
    p.worker, p.num_workers, p.local_rank, p.local_world_size

Each quantity comes from the first of these that gives it:

1. the caller's argument (init(worker=...));
2. BNPS_WORKER, BNPS_NUM_WORKERS (BNPS_* win: the launchers' variables are
   then not read for that quantity);
3. the launchers' variables:
   torchrun   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (its agent also
              sets GROUP_WORLD_SIZE, the number of nodes, and
              TORCHELASTIC_RUN_ID)
   Kubeflow   PET_NODE_RANK, PET_NNODES, PET_NPROC_PER_NODE (Trainer's
              torch runtime; torchrun reads them too): worker = node rank x
              processes per node + local rank, workers = nodes x processes
   Slurm      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (srun, one task per
              process)
   Ray Train  the worker's train context (ray.train.get_context(): world
              rank and size, local rank and size), read when this process
              has imported ray.train (as a TorchTrainer's workers have) and
              placement() reads os.environ; Ray Train also sets torchrun's
              variables, which must agree with it
   Several launchers may describe one process (Kubeflow or Slurm starting
   torchrun); they must agree on every quantity bnps uses, or placement()
   raises ValueError naming both variables and their values. Under
   torchrun's agent (TORCHELASTIC_RUN_ID set) the Slurm task is the agent,
   not this process: Slurm's variables are not read, and Kubeflow's only for
   the counts (its node rank is the agent's rendezvous order's business).
   A PET_NNODES or PET_NPROC_PER_NODE that is not a number ("1:4", "auto":
   torchrun's own forms) is left to torchrun.

Errors are ValueError: a variable that is not a non-negative integer (named
with its value, only when it is used), disagreeing launchers, a worker id
outside [0, num_workers).

A job with a server per node (init(start_local_server=True)) starts it in
each node's local rank 0 (starts_node_server). Under Kubeflow Trainer the
servers' addresses are known before any starts (trainer_servers): node N is
the JobSet pod <trainjob>-node-0-N under the TrainJob's subdomain, the name
Trainer gives node 0 in PET_MASTER_ADDR, so node N's server is shard N of
PET_NNODES, at that name and a fixed port. Elsewhere they travel over the
process group (bnps.torch.node_server).
"""

import dataclasses
import os
import re
import sys

# The port of a node's server when its address is derived (trainer_servers).
DEFAULT_NODE_SERVER_PORT = 7000

_WHAT = {"worker": "the worker id", "num_workers": "the number of workers",
         "local_rank": "the local rank",
         "local_world_size": "the processes per node",
         "num_nodes": "the number of nodes"}


@dataclasses.dataclass(frozen=True)
class Placement:
    worker: int
    num_workers: int
    local_rank: object = None        # int, or None when no variable says
    local_world_size: object = None  # int, or None when no variable says
    num_nodes: object = None         # int, or None when no variable says
    # quantity -> where it came from ("RANK=3", "argument", ...)
    sources: dict = dataclasses.field(default_factory=dict, compare=False)


class _Claims:
    """What the launchers' variables say, quantity by quantity; the first
    disagreement on a quantity is kept and raised when it is used."""

    def __init__(self):
        self.values = {}     # quantity -> (value, source)
        self.conflicts = {}  # quantity -> message

    def read(self, quantity, e, name, lenient=False):
        """The variable `name` (None when unset), read for `quantity`: a bad
        value is that quantity's error, raised when it is used."""
        try:
            return e.int(name, lenient)
        except ValueError as bad:
            self.conflicts.setdefault(quantity, str(bad))
            return None, None

    def add_var(self, quantity, e, name, lenient=False):
        """Claims `quantity` = the variable `name`; returns its value."""
        value, source = self.read(quantity, e, name, lenient)
        self.add(quantity, value, source)
        return value

    def add(self, quantity, value, source):
        if value is None:
            return
        have = self.values.get(quantity)
        if have is None:
            self.values[quantity] = (value, source)
        elif have[0] != value and quantity not in self.conflicts:
            self.conflicts[quantity] = (
                f"bnps: the launchers' variables disagree on "
                f"{_WHAT[quantity]}: {have[1]} but {source}")

    def get(self, quantity):
        if quantity in self.conflicts:
            raise ValueError(self.conflicts[quantity])
        return self.values.get(quantity, (None, None))


class _Env:
    def __init__(self, env):
        self.env = env

    def has(self, name):
        return self.env.get(name, "") != ""

    def int(self, name, lenient=False):
        """(value, "NAME=raw") or (None, None) when unset; a bad value
        raises, or with `lenient` counts as unset."""
        raw = self.env.get(name, "")
        if raw == "":
            return None, None
        try:
            value = int(raw.strip())
            if value < 0:
                raise ValueError
        except ValueError:
            if lenient:
                return None, None
            raise ValueError(f"bnps: ${name}={raw!r} is not a non-negative "
                             f"integer") from None
        return value, f"{name}={raw.strip()}"


# Ray Train's context, quantity by quantity: (quantity, method).
_RAY_TRAIN = (("worker", "get_world_rank"), ("num_workers", "get_world_size"),
              ("local_rank", "get_local_rank"),
              ("local_world_size", "get_local_world_size"))


def ray_train_context():
    """This process's Ray Train context (ray.train.get_context()), or None
    outside a Ray Train worker: ray.train not imported by the process (it is
    never imported here), or no session (its world size unknown)."""
    if "ray.train" not in sys.modules:
        return None
    try:
        context = sys.modules["ray.train"].get_context()
        if not isinstance(context.get_world_size(), int):
            return None
    except Exception:  # no Ray Train session in this process
        return None
    return context


def _ray_claims(c, context):
    for quantity, method in _RAY_TRAIN:
        try:
            value = getattr(context, method)()
        except Exception:
            continue
        if isinstance(value, int) and value >= 0:
            c.add(quantity, value, f"Ray Train's {method}()={value}")


def _launcher_claims(e, ray_context=None):
    c = _Claims()
    if ray_context is not None:
        _ray_claims(c, ray_context)
    for quantity, name in (("worker", "RANK"), ("num_workers", "WORLD_SIZE"),
                           ("local_rank", "LOCAL_RANK"),
                           ("local_world_size", "LOCAL_WORLD_SIZE"),
                           ("num_nodes", "GROUP_WORLD_SIZE")):
        c.add_var(quantity, e, name)
    under_agent = e.has("TORCHELASTIC_RUN_ID")
    # Kubeflow Trainer.
    nodes = c.add_var("num_nodes", e, "PET_NNODES", lenient=True)
    per_node = c.add_var("local_world_size", e, "PET_NPROC_PER_NODE",
                         lenient=True)
    if nodes is not None and per_node is not None:
        c.add("num_workers", nodes * per_node,
              f"PET_NNODES={nodes} x PET_NPROC_PER_NODE={per_node}")
    if not under_agent:
        node, _ = c.read("worker", e, "PET_NODE_RANK")
        if node is not None and per_node is not None:
            # This process's rank on its node: LOCAL_RANK, or 0 when the
            # node runs one process.
            local = c.values.get("local_rank", (None,))[0]
            if local is None and per_node == 1:
                local = 0
            if local is not None:
                c.add("worker", node * per_node + local,
                      f"PET_NODE_RANK={node} x PET_NPROC_PER_NODE={per_node}"
                      + (f" + LOCAL_RANK={local}" if per_node > 1 else ""))
        # Slurm: srun started this process as one of its tasks.
        c.add_var("worker", e, "SLURM_PROCID")
        c.add_var("num_workers", e, "SLURM_NTASKS")
        c.add_var("local_rank", e, "SLURM_LOCALID")
    return c


def placement(env=None, worker=None, num_workers=None, ray_context=None):
    """The Placement of this process; `env` defaults to os.environ, and
    then `ray_context` to ray_train_context(). Raises ValueError when the
    worker id or the number of workers is given by no argument and no
    variable, or as the module says."""
    if env is None and ray_context is None:
        ray_context = ray_train_context()
    e = _Env(os.environ if env is None else env)
    claims = None
    found, sources = {}, {}
    for quantity, arg, bnps_var in (
            ("worker", worker, "BNPS_WORKER"),
            ("num_workers", num_workers, "BNPS_NUM_WORKERS"),
            ("local_rank", None, None), ("local_world_size", None, None),
            ("num_nodes", None, None)):
        if arg is not None:
            found[quantity], sources[quantity] = int(arg), "argument"
            continue
        if bnps_var is not None:
            value, src = e.int(bnps_var)
            if value is not None:
                found[quantity], sources[quantity] = value, src
                continue
        if claims is None:  # read only when a quantity needs them
            claims = _launcher_claims(e, ray_context)
        found[quantity], sources[quantity] = claims.get(quantity)
    if found["worker"] is None or found["num_workers"] is None:
        raise ValueError(
            "bnps.torch.init: no worker id or number of workers: pass "
            "worker= and num_workers=, set BNPS_WORKER and BNPS_NUM_WORKERS, "
            "or run under torchrun (RANK, WORLD_SIZE), Kubeflow Trainer "
            "(PET_NODE_RANK, PET_NNODES, PET_NPROC_PER_NODE), Slurm's srun "
            "(SLURM_PROCID, SLURM_NTASKS) or Ray Train (a TorchTrainer's "
            "workers)")
    if not 0 <= found["worker"] < found["num_workers"]:
        raise ValueError(
            f"bnps: worker {found['worker']} ({sources['worker']}) is not in "
            f"[0, {found['num_workers']}) ({sources['num_workers']})")
    return Placement(sources={k: v for k, v in sources.items() if v},
                     **found)


def starts_node_server(p):
    """Whether this process starts its node's server in a job with a server
    per node: it is its node's local rank 0. Raises ValueError when no
    variable gives the local rank."""
    if p.local_rank is None:
        raise ValueError(
            "bnps.torch.init(start_local_server=True): no local rank (set "
            "LOCAL_RANK, as torchrun does, or SLURM_LOCALID)")
    return p.local_rank == 0


@dataclasses.dataclass(frozen=True)
class NodeServers:
    """The servers of a job with a server per node, known from the
    launcher: `servers` ("host:port,..." in shard order), this node's
    `shard` of `num_shards`, and the `port` its server binds."""
    servers: str
    shard: int
    num_shards: int
    port: int


# JobSet's pod host name <jobset>-<replicated job>-<job index>-<pod index>;
# Trainer's trainer nodes are replicated job "node", one Job, pod index N.
_TRAINER_NODE_0 = re.compile(
    r"^(?P<prefix>[a-z0-9]([-a-z0-9]*[a-z0-9])?-node-0)-0"
    r"(?P<domain>\.[a-z0-9]([-.a-z0-9]*[a-z0-9])?)$")


def trainer_servers(env=None, port=None):
    """The NodeServers of a Kubeflow Trainer job (torch runtime): one per
    trainer node, shard N at the JobSet DNS name of node N (derived from
    PET_MASTER_ADDR, node 0's), port `port` (default BNPS_NODE_SERVER_PORT,
    else DEFAULT_NODE_SERVER_PORT); this node's shard is PET_NODE_RANK.
    None when the job is not one: PET_MASTER_ADDR, PET_NNODES (a number) or
    PET_NODE_RANK unset, or PET_MASTER_ADDR not Trainer's form
    <trainjob>-node-0-0.<subdomain>. Raises ValueError for a bad number."""
    e = _Env(os.environ if env is None else env)
    match = _TRAINER_NODE_0.match(e.env.get("PET_MASTER_ADDR", "").strip())
    nodes, _ = e.int("PET_NNODES", lenient=True)
    if match is None or not nodes:
        return None
    node, _ = e.int("PET_NODE_RANK")
    if node is None:
        return None
    if node >= nodes:
        raise ValueError(f"bnps: PET_NODE_RANK={node} is not in [0, "
                         f"PET_NNODES={nodes})")
    if port is None:
        port, _ = e.int("BNPS_NODE_SERVER_PORT")
        port = DEFAULT_NODE_SERVER_PORT if port is None else port
    servers = ",".join(f"{match['prefix']}-{n}{match['domain']}:{port}"
                       for n in range(nodes))
    return NodeServers(servers, node, nodes, port)
