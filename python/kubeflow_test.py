"""The Kubeflow Trainer runtime's wiring without a cluster: the trainer pods
of deploy/kubeflow's TrainJob get the environment Trainer's torch plugin and
torchrun give them (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
PET_MASTER_ADDR; RANK, LOCAL_RANK, ...), and bnps.launch must derive from it
the right worker ids, W, servers and which processes start one. Pure Python
and PyYAML: no torch, no network."""

import os
import sys
import unittest

import yaml

sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles

from bnps.launch import (placement, starts_node_server,  # noqa: E402
                         trainer_servers)

KUBEFLOW = os.path.join(os.getcwd(), "deploy", "kubeflow")
TRAINER_PORT = 29400  # Trainer's PET_MASTER_PORT
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"


def load(name):
    with open(os.path.join(KUBEFLOW, name)) as f:
        return yaml.safe_load(f)


def trainer_node(runtime):
    """The runtime's trainer replicated job's name and its container
    "node", where Trainer looks for them."""
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        if rjob["template"]["metadata"]["labels"].get(ANCESTOR) == "trainer":
            pod = rjob["template"]["spec"]["template"]["spec"]
            return rjob["name"], [c for c in pod["containers"]
                                  if c["name"] == "node"][0]
    raise AssertionError("no trainer replicated job")


def processes(trainjob, runtime, group_rank=lambda node: node):
    """(host name, environment) of every process, as Trainer makes the pods
    and torchrun, in each, its processes; `group_rank` is torchrun's
    rendezvous order of the nodes."""
    name, spec = trainjob["metadata"]["name"], trainjob["spec"]["trainer"]
    job, container = trainer_node(runtime)
    nodes, per_node = spec["numNodes"], spec["numProcPerNode"]
    base = {e["name"]: e["value"]
            for e in container.get("env", []) + spec.get("env", [])}
    out = []
    for node in range(nodes):
        # JobSet: pod host name <jobset>-<replicated job>-<job index>-<pod
        # index>, under the subdomain <jobset>, the TrainJob's name.
        host = f"{name}-{job}-0-{node}"
        pod = dict(base, PET_NNODES=str(nodes),
                   PET_NPROC_PER_NODE=str(per_node), PET_NODE_RANK=str(node),
                   PET_MASTER_ADDR=f"{name}-node-0-0.{name}",
                   PET_MASTER_PORT=str(TRAINER_PORT))
        group = group_rank(node)
        for local in range(per_node):
            out.append((host, dict(
                pod, RANK=str(group * per_node + local),
                LOCAL_RANK=str(local), WORLD_SIZE=str(nodes * per_node),
                LOCAL_WORLD_SIZE=str(per_node), GROUP_RANK=str(group),
                GROUP_WORLD_SIZE=str(nodes), TORCHELASTIC_RUN_ID="none")))
    return out


class TrainerWiringTest(unittest.TestCase):
    def setUp(self):
        self.trainjob = load("trainjob.yaml")
        self.runtime = load("runtime.yaml")
        self.assertEqual(self.trainjob["spec"]["runtimeRef"]["name"],
                         self.runtime["metadata"]["name"])

    def check(self, group_rank=lambda node: node):
        spec = self.trainjob["spec"]["trainer"]
        name = self.trainjob["metadata"]["name"]
        _, container = trainer_node(self.runtime)
        # The port the probe checks is the one the addresses name.
        probe_port = container["readinessProbe"]["grpc"]["port"]
        everyone = ",".join(f"{name}-node-0-{n}.{name}:{probe_port}"
                            for n in range(spec["numNodes"]))
        workers, started = [], {}
        for host, env in processes(self.trainjob, self.runtime, group_rank):
            p = placement(env)
            self.assertEqual(p.num_workers,
                             spec["numNodes"] * spec["numProcPerNode"])
            workers.append(p.worker)
            known = trainer_servers(env)
            self.assertEqual(known.servers, everyone)
            if starts_node_server(p):
                # Each node's server is the shard whose address is its pod.
                self.assertNotIn(known.shard, started)
                started[known.shard] = host
                self.assertEqual(known.servers.split(",")[known.shard],
                                 f"{host}.{name}:{known.port}")
        self.assertEqual(sorted(workers), list(range(len(workers))))
        self.assertEqual(sorted(started), list(range(spec["numNodes"])))

    def test_the_scraped_port_is_the_node_servers_and_no_process_takes_it(self):
        pod = self.runtime["spec"]["template"]["spec"]["replicatedJobs"]
        _, container = trainer_node(self.runtime)
        for rjob in pod:
            if rjob["template"]["metadata"]["labels"].get(ANCESTOR) == \
                    "trainer":
                annotations = rjob["template"]["spec"]["template"][
                    "metadata"]["annotations"]
        env = {e["name"]: e["value"] for e in container["env"]}
        scraped = int(annotations["prometheus.io/port"])
        self.assertEqual(int(env["BNPS_NODE_SERVER_METRICS_PORT"]), scraped)
        self.assertIn(scraped, [p["containerPort"]
                                for p in container["ports"]])
        # The processes' ports (BNPS_METRICS_PORT + LOCAL_RANK) stay clear
        # of the server's, its metrics and each other, whatever
        # numProcPerNode (up to 64 here).
        server_port = container["readinessProbe"]["grpc"]["port"]
        mine = [int(env["BNPS_METRICS_PORT"]) + r for r in range(64)]
        self.assertNotIn(scraped, mine)
        self.assertNotIn(server_port, mine)

    def test_example_trainjob(self):
        spec = self.trainjob["spec"]["trainer"]
        self.assertEqual((spec["numNodes"], spec["numProcPerNode"]), (2, 2))
        self.check()

    def test_rendezvous_order_is_not_the_node_order(self):
        # torchrun's rendezvous may rank the nodes in any order: the worker
        # ids follow it, the shards follow the pods.
        self.trainjob["spec"]["trainer"].update(numNodes=3, numProcPerNode=2)
        self.check(group_rank=lambda node: (node + 1) % 3)

    def test_one_process_per_node(self):
        self.trainjob["spec"]["trainer"].update(numNodes=4, numProcPerNode=1)
        self.check()


if __name__ == "__main__":
    unittest.main()
