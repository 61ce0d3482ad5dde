#!/usr/bin/env python3
"""Tests of deploy/to_pods.py: manifests in, the Pods their controllers make out.

Needs Python 3 and PyYAML only (Debian's python3-yaml): the manifests here
are written out by hand, as kubectl kustomize would render them.

Run: python3 deploy/to_pods_test.py   or   bazel test //deploy:to_pods_test
"""

import base64
import copy
import os
import subprocess
import sys
import tempfile
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import to_pods  # noqa: E402

TOKEN = b"0123456789abcdef" * 8  # long enough for kustomize to wrap it


def _b64_wrapped(data):
    text = base64.b64encode(data).decode()
    return "\n".join(text[i:i + 76] for i in range(0, len(text), 76))


def _container(name, command, config_map, extra_env=(), mounts=()):
    return {
        "name": name, "image": "localhost/bnps:latest", "command": command,
        "envFrom": [{"configMapRef": {"name": config_map}}],
        "env": list(extra_env),
        "ports": [{"name": "grpc", "containerPort": 7000}],
        "readinessProbe": {"grpc": {"port": 7000}},
        "livenessProbe": {"grpc": {"port": 7000}},
        "volumeMounts": [{"name": "token", "mountPath": "/etc/bnps/token"}] + list(mounts),
    }


def _pod_spec(container):
    return {
        "restartPolicy": "OnFailure",
        "securityContext": {"runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001},
        "containers": [container],
        "volumes": [{"name": "token", "secret": {"secretName": "bnps-token-abc"}}],
    }


def _common():
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bnps-server-x"},
         "data": {"BNPS_NUM_SHARDS": "2", "BNPS_SHARD": "from-configmap"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bnps-worker-x"},
         "data": {"BNPS_NUM_WORKERS": "3", "NUM_SERVERS": "2"}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bnps-token-abc"},
         "data": {"token": _b64_wrapped(TOKEN)}},
    ]


def jobset_manifests():
    server = _container(
        "server", ["bnps_server"], "bnps-server-x",
        extra_env=[{"name": "BNPS_SHARD", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}],
        mounts=[{"name": "checkpoints", "mountPath": "/ckpt", "subPathExpr": "shard-$(BNPS_SHARD)"}])
    worker = _container(
        "worker", ["/bin/sh", "-c", "exec bnps_worker"], "bnps-worker-x",
        extra_env=[{"name": "JOBSET_NAME", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}}},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NUM_SERVERS", "value": "9"}])

    def rjob(name, completions, container, labels):
        return {"name": name, "replicas": 1, "template": {"spec": {
            "completionMode": "Indexed", "completions": completions, "parallelism": completions,
            "template": {"metadata": {"labels": labels}, "spec": _pod_spec(container)}}}}
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "js"},
        "spec": {
            "network": {"enableDNSHostnames": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["workers"]},
            "volumeClaimPolicies": [{"templates": [{"metadata": {"name": "checkpoints"},
                                                    "spec": {"accessModes": ["ReadWriteMany"]}}]}],
            "replicatedJobs": [rjob("servers", 2, server, {"app": "server"}),
                               rjob("workers", 3, worker, {"app": "worker"})],
        }}
    return _common() + [jobset]


def stateful_set_manifests():
    server = _container("server", ["bnps_server"], "bnps-server-x",
                        mounts=[{"name": "checkpoints", "mountPath": "/ckpt"}])
    worker = _container("worker", ["bnps_worker"], "bnps-worker-x")
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "bnps-server"},
           "spec": {"serviceName": "bnps-server", "replicas": 2,
                    "template": {"metadata": {"labels": {"app": "server"}},
                                 "spec": _pod_spec(server)},
                    "volumeClaimTemplates": [{"metadata": {"name": "checkpoints"}, "spec": {}}]}}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "bnps-worker"},
           "spec": {"completionMode": "Indexed", "completions": 3,
                    "template": {"metadata": {"labels": {"app": "worker"}},
                                 "spec": _pod_spec(worker)}}}
    return _common() + [sts, job]


def _env(pod):
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


class ToPodsTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.tmp.name, "out")

    def tearDown(self):
        self.tmp.cleanup()

    def render(self, docs):
        r = to_pods.Renderer(copy.deepcopy(docs), self.out, "10.89.3")
        r.render()
        r.write()
        return r

    def test_jobset_pods_names_and_roles(self):
        r = self.render(jobset_manifests())
        self.assertEqual([p["metadata"]["name"] for p in r.servers],
                         ["js-servers-0-0", "js-servers-0-1"])
        self.assertEqual([p["metadata"]["name"] for p in r.workers],
                         ["js-workers-0-0", "js-workers-0-1", "js-workers-0-2"])
        self.assertEqual(r.ips, ["10.89.3.10", "10.89.3.11"])
        for pod in r.servers + r.workers:
            self.assertEqual(pod["spec"]["hostname"], pod["metadata"]["name"])
            self.assertEqual(pod["spec"]["subdomain"], "js")  # the JobSet's name
        # Workers reach servers by <hostname>.<subdomain>, as under the
        # JobSet's headless Service.
        self.assertEqual(r.workers[2]["spec"]["hostAliases"], [
            {"ip": "10.89.3.10", "hostnames": ["js-servers-0-0.js", "js-servers-0-0"]},
            {"ip": "10.89.3.11", "hostnames": ["js-servers-0-1.js", "js-servers-0-1"]}])
        self.assertNotIn("hostAliases", r.servers[0]["spec"])
        labels = r.workers[1]["metadata"]["labels"]
        self.assertEqual(labels["app"], "worker")
        self.assertEqual(labels["jobset.sigs.k8s.io/jobset-name"], "js")
        self.assertEqual(labels["jobset.sigs.k8s.io/replicatedjob-name"], "workers")
        self.assertEqual(labels["jobset.sigs.k8s.io/job-global-index"], "1")
        self.assertEqual(labels["batch.kubernetes.io/job-completion-index"], "1")

    def test_jobset_environment_as_kubernetes_sets_it(self):
        r = self.render(jobset_manifests())
        server1 = _env(r.servers[1])
        # envFrom first, then the container's env, which wins: the shard is
        # the completion index, not the ConfigMap's value.
        self.assertEqual(server1["BNPS_SHARD"], "1")
        self.assertEqual(server1["BNPS_NUM_SHARDS"], "2")
        self.assertEqual(server1["JOB_COMPLETION_INDEX"], "1")
        names = [e["name"] for e in r.servers[1]["spec"]["containers"][0]["env"]]
        self.assertLess(names.index("BNPS_NUM_SHARDS"), names.index("JOB_COMPLETION_INDEX"))
        worker2 = _env(r.workers[2])
        self.assertEqual(worker2["JOBSET_NAME"], "js")
        self.assertEqual(worker2["POD"], "js-workers-0-2")
        self.assertEqual(worker2["JOB_COMPLETION_INDEX"], "2")
        # The container's NUM_SERVERS=9 comes after the ConfigMap's 2, so the
        # shell (and the kubelet) would see 9: both entries stay, in order.
        values = [e["value"] for e in r.workers[2]["spec"]["containers"][0]["env"]
                  if e["name"] == "NUM_SERVERS"]
        self.assertEqual(values, ["2", "9"])

    def test_probes_ports_and_env_from_are_dropped(self):
        r = self.render(jobset_manifests())
        c = r.servers[0]["spec"]["containers"][0]
        for key in ("readinessProbe", "livenessProbe", "ports", "envFrom"):
            self.assertNotIn(key, c)

    def test_jobset_claim_split_by_sub_path_expr(self):
        r = self.render(jobset_manifests())
        for shard, pod in enumerate(r.servers):
            mount = [m for m in pod["spec"]["containers"][0]["volumeMounts"]
                     if m["mountPath"] == "/ckpt"][0]
            self.assertNotIn("subPathExpr", mount)
            volume = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]][0]
            want = os.path.join(self.out, "volumes", "checkpoints-js", "shard-%d" % shard)
            self.assertEqual(volume["hostPath"]["path"], os.path.abspath(want))
            self.assertTrue(os.path.isdir(want))
        # Workers mount no claim, so the JobSet adds none to them.
        self.assertEqual([v["name"] for v in r.workers[0]["spec"]["volumes"]], ["token"])

    def test_secret_files_decoded(self):
        r = self.render(jobset_manifests())
        volume = r.workers[0]["spec"]["volumes"][0]
        self.assertNotIn("secret", volume)
        with open(os.path.join(volume["hostPath"]["path"], "token"), "rb") as f:
            self.assertEqual(f.read(), TOKEN)

    def test_stateful_set_and_indexed_job(self):
        r = self.render(stateful_set_manifests())
        self.assertEqual([p["metadata"]["name"] for p in r.servers],
                         ["bnps-server-0", "bnps-server-1"])
        self.assertEqual(r.servers[1]["spec"]["hostname"], "bnps-server-1")
        self.assertEqual(r.servers[1]["spec"]["subdomain"], "bnps-server")
        # The server keeps the ConfigMap's shard (no completion index here).
        self.assertEqual(_env(r.servers[1])["BNPS_SHARD"], "from-configmap")
        self.assertNotIn("JOB_COMPLETION_INDEX", _env(r.servers[1]))
        claim = [v for v in r.servers[1]["spec"]["volumes"] if v["name"] == "checkpoints"][0]
        self.assertEqual(claim["hostPath"]["path"], os.path.abspath(
            os.path.join(self.out, "volumes", "checkpoints-bnps-server-1")))
        self.assertEqual([p["metadata"]["name"] for p in r.workers],
                         ["bnps-worker-0", "bnps-worker-1", "bnps-worker-2"])
        self.assertEqual(_env(r.workers[2])["JOB_COMPLETION_INDEX"], "2")
        self.assertEqual(r.workers[0]["spec"]["hostAliases"][1],
                         {"ip": "10.89.3.11",
                          "hostnames": ["bnps-server-1.bnps-server", "bnps-server-1"]})

    def test_files_written(self):
        self.render(jobset_manifests())
        with open(os.path.join(self.out, "ips")) as f:
            self.assertEqual(f.read(), "10.89.3.10\n10.89.3.11\n")
        with open(os.path.join(self.out, "worker-pods")) as f:
            self.assertEqual(f.read().split(), ["js-workers-0-0", "js-workers-0-1",
                                                "js-workers-0-2"])
        with open(os.path.join(self.out, "servers.yaml")) as f:
            pods = list(yaml.safe_load_all(f))
        self.assertEqual([p["kind"] for p in pods], ["Pod", "Pod"])

    def test_refuses_what_it_cannot_render(self):
        cases = []
        docs = jobset_manifests()
        del docs[-1]["spec"]["successPolicy"]
        cases.append((docs, "targetReplicatedJobs"))
        docs = jobset_manifests()
        del docs[-1]["spec"]["replicatedJobs"][1]["template"]["spec"]["completionMode"]
        cases.append((docs, "not Indexed"))
        docs = jobset_manifests()
        del docs[1]  # the workers' ConfigMap
        cases.append((docs, "no ConfigMap bnps-worker-x"))
        docs = jobset_manifests()
        env = docs[-1]["spec"]["replicatedJobs"][1]["template"]["spec"]["template"][
            "spec"]["containers"][0]["env"]
        env[0]["valueFrom"]["fieldRef"]["fieldPath"] = "spec.nodeName"
        cases.append((docs, "spec.nodeName"))
        docs = jobset_manifests()
        mounts = docs[-1]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
            "spec"]["containers"][0]["volumeMounts"]
        mounts[1]["subPathExpr"] = "$(NO_SUCH_VAR)"
        cases.append((docs, "no variable NO_SUCH_VAR"))
        for docs, message in cases:
            with self.subTest(message=message):
                with self.assertRaisesRegex(to_pods.RenderError, message):
                    self.render(docs)

    def test_command_line(self):
        manifests = os.path.join(self.tmp.name, "all.yaml")
        with open(manifests, "w") as f:
            yaml.safe_dump_all(jobset_manifests(), f)
        run = subprocess.run([sys.executable, os.path.join(HERE, "to_pods.py"), manifests,
                              self.out, "10.89.3"], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("2 server pods, 3 worker pods", run.stdout)
        with open(manifests, "w") as f:
            yaml.safe_dump_all(_common(), f)
        run = subprocess.run([sys.executable, os.path.join(HERE, "to_pods.py"), manifests,
                              self.out, "10.89.3"], capture_output=True, text=True)
        self.assertEqual(run.returncode, 1)
        self.assertIn("no server Pods", run.stderr)


if __name__ == "__main__":
    unittest.main()
