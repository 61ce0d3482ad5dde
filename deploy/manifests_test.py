#!/usr/bin/env python3
"""Tests of the Kubernetes manifests (deploy/base, gpu, tls, jobset, jobset-tls,
kubeflow)
and of their offline validator, deploy/validate.py.

The JobSet workers' entrypoint (BNPS_SERVERS from NUM_SERVERS and the JobSet's
name) runs here with Debian's python3 and PyYAML. Rendering (kubectl
kustomize) and validating need the virtual environment tools/setup.sh
--containers makes (BNPS_VENV, default /opt/bnps-venv): without it those
tests are skipped, saying so.

Run: python3 deploy/manifests_test.py   or   bazel test //deploy:manifests_test
"""

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import to_pods  # noqa: E402

VENV = os.environ.get("BNPS_VENV", "/opt/bnps-venv")
VENV_PYTHON = os.path.join(VENV, "bin", "python3")
KUBECTL = os.path.join(VENV, "bin", "kubectl")
HAVE_VENV = os.access(KUBECTL, os.X_OK) and subprocess.run(
    [VENV_PYTHON, "-c", "import kubernetes_validate"], capture_output=True).returncode == 0 \
    if os.access(VENV_PYTHON, os.X_OK) else False
NO_VENV = "no validator and kubectl in %s (tools/setup.sh --containers installs them)" % VENV
OVERLAYS = ["base", "gpu", "tls", "jobset", "jobset-tls", "kubeflow", "kueue"]


def _jobset_doc(text):
    return [d for d in yaml.safe_load_all(text) if d and d["kind"] == "JobSet"][0]


def _rjob(jobset, name):
    return [r for r in jobset["spec"]["replicatedJobs"] if r["name"] == name][0]


class WorkerEntrypointTest(unittest.TestCase):
    """The shell in jobset.yaml that turns NUM_SERVERS into BNPS_SERVERS."""

    def run_entrypoint(self, env):
        with open(os.path.join(HERE, "jobset", "jobset.yaml")) as f:
            jobset = _jobset_doc(f.read())
        container = _rjob(jobset, "workers")["template"]["spec"]["template"]["spec"][
            "containers"][0]
        with tempfile.TemporaryDirectory() as bin_dir:
            fake = os.path.join(bin_dir, "bnps_worker")
            with open(fake, "w") as f:
                f.write('#!/bin/sh\necho "BNPS_SERVERS=$BNPS_SERVERS"\n')
            os.chmod(fake, stat.S_IRWXU)
            env = dict(env, PATH=bin_dir + ":/usr/bin:/bin")
            return subprocess.run(container["command"], env=env, capture_output=True,
                                  text=True, timeout=30)

    def test_servers_in_shard_order(self):
        run = self.run_entrypoint({"NUM_SERVERS": "3", "JOBSET_NAME": "fashion"})
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(run.stdout.strip(), "BNPS_SERVERS=" + ",".join(
            "fashion-servers-0-%d.fashion:7000" % i for i in range(3)))

    def test_one_server(self):
        run = self.run_entrypoint({"NUM_SERVERS": "1", "JOBSET_NAME": "bnps"})
        self.assertEqual(run.stdout.strip(), "BNPS_SERVERS=bnps-servers-0-0.bnps:7000")

    def test_no_count_fails(self):
        # Unrendered (kustomize's placeholder): the pod fails at once.
        run = self.run_entrypoint({"NUM_SERVERS": "set-by-kustomize-from-sizes.yaml",
                                   "JOBSET_NAME": "bnps"})
        self.assertNotEqual(run.returncode, 0)
        self.assertNotIn("BNPS_SERVERS=", run.stdout)


@unittest.skipUnless(HAVE_VENV, NO_VENV)
class ManifestsTest(unittest.TestCase):
    """Renders the overlays from a copy of deploy/ with placeholder secrets."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.deploy = os.path.join(cls.tmp.name, "deploy")
        shutil.copytree(HERE, cls.deploy, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
        for secrets, files in (("base", ["token"]), ("jobset", ["token"]),
                               ("tls", ["ca.pem", "tls.pem", "tls.key"]),
                               ("jobset-tls", ["ca.pem", "tls.pem", "tls.key"])):
            for name in files:
                with open(os.path.join(cls.deploy, secrets, "secrets", name), "w") as f:
                    f.write("placeholder %s\n" % name)
        cls.rendered = {o: cls.kustomize(o) for o in OVERLAYS}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @classmethod
    def kustomize(cls, overlay):
        run = subprocess.run([KUBECTL, "kustomize", os.path.join(cls.deploy, overlay)],
                             capture_output=True, text=True, timeout=60)
        if run.returncode != 0:
            raise AssertionError("kubectl kustomize %s: %s" % (overlay, run.stderr))
        return run.stdout

    def validate(self, text):
        return subprocess.run([VENV_PYTHON, os.path.join(HERE, "validate.py"), "-"],
                              input=text, capture_output=True, text=True, timeout=120)

    def test_every_overlay_is_valid(self):
        for overlay in OVERLAYS:
            with self.subTest(overlay=overlay):
                run = self.validate(self.rendered[overlay])
                self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
                self.assertNotIn("INVALID", run.stdout)
                self.assertRegex(run.stdout.splitlines()[-1], r"^(\d+) of \1 objects valid")

    def test_invalid_objects_fail(self):
        base, jobset = self.rendered["base"], self.rendered["jobset"]
        cases = [
            # Kubernetes' schema, built-in kinds.
            (base.replace("replicas: 2", 'replicas: "two"'), "spec.replicas: 'two'"),
            (base.replace("readOnlyRootFilesystem", "readOnlyRootFileSystem"),
             "'readOnlyRootFileSystem' was unexpected"),
            # Our JobSet schema.
            (jobset.replace("replicas: 1", 'replicas: "one"', 1), "replicas: 'one'"),
            (jobset.replace("operator: All", "operator: Every"), "'Every' is not one of"),
            (jobset.replace("enableDNSHostnames", "enableDnsHostnames"),
             "'enableDnsHostnames' was unexpected"),
            (jobset.replace("whenDeleted: Retain", "whenDeleted: Keep"), "'Keep' is not one of"),
            # Kubernetes' Job schema inside the JobSet.
            (jobset.replace("completions: 4", 'completions: "four"'),
             "replicatedJobs.1.template (a Job): spec.completions"),
            # Kubernetes' claim schema inside the JobSet.
            (jobset.replace("accessModes:", "accessMode:"),
             "(a PersistentVolumeClaim): spec: Additional properties"),
            # Names the controller's webhook would refuse.
            (jobset.replace("- workers\n", "- worker\n", 1), "no replicated job named worker"),
            # A kind nobody has a schema for.
            (jobset.replace("kind: JobSet", "kind: JobSets"), "no schema for"),
        ]
        self.assert_invalid(cases, lambda message: jobset if "JobSet" in message else base)

    def assert_invalid(self, cases, original):
        """Each (text, message): the validator fails the text, saying message;
        original(message) is the text it was made from."""
        for text, message in cases:
            with self.subTest(message=message):
                self.assertNotEqual(text, original(message))
                run = self.validate(text)
                self.assertEqual(run.returncode, 1, run.stdout)
                self.assertIn(message, run.stdout)

    def test_invalid_trainer_objects_fail(self):
        kubeflow = self.rendered["kubeflow"]
        cases = [
            # Trainer's CRD schemas, made strict.
            (kubeflow.replace("numProcPerNode: 2", 'numProcPerNode: "two"'),
             "TrainJob/bnps-fashion: spec.trainer.numProcPerNode: 'two'"),
            (kubeflow.replace("numNodes: 2", "numNode: 2"),
             "spec.trainer: Additional properties are not allowed ('numNode'"),
            (kubeflow.replace("runtimeRef:", "runtime:"),
             "'runtimeRef' is a required property"),
            (kubeflow.replace("torch: {}", "pytorch: {}"),
             "spec.mlPolicy: Additional properties are not allowed ('pytorch'"),
            # The runtime's JobSet template: our JobSet schema, then the Job.
            (kubeflow.replace("enableDNSHostnames", "enableDnsHostnames"),
             "spec.template.spec.network: Additional properties"),
            (kubeflow.replace("readOnlyRootFilesystem", "readOnlyRootFileSystem"),
             "replicatedJobs.0.template (a Job): "),
            # Where Trainer looks for the trainer nodes.
            (kubeflow.replace("- name: node\n", "- name: nodes\n", 1),
             "no replicated job named node"),
            (kubeflow.replace("trainjob-ancestor-step: trainer", "trainjob-ancestor-step: x"),
             "no trainer.kubeflow.org/trainjob-ancestor-step: trainer"),
            (kubeflow.replace("\n                  name: node\n", "\n                  name: main\n"),
             "no container named node"),
        ]
        self.assert_invalid(cases, lambda message: kubeflow)

    def test_kubeflow_runtime_pods_match_jobset(self):
        # The same security settings and scrape annotations as the JobSet's
        # workers, and the servers' readiness probe and ports.
        docs = {d["kind"]: d for d in yaml.safe_load_all(self.rendered["kubeflow"]) if d}
        jobset = _jobset_doc(self.rendered["jobset"])
        ours = _rjob(docs["ClusterTrainingRuntime"]["spec"]["template"], "node")[
            "template"]["spec"]["template"]
        workers = _rjob(jobset, "workers")["template"]["spec"]["template"]
        servers = _rjob(jobset, "servers")["template"]["spec"]["template"]
        self.assertEqual(ours["metadata"]["annotations"], workers["metadata"]["annotations"])
        for key in ("securityContext", "enableServiceLinks"):
            self.assertEqual(ours["spec"][key], workers["spec"][key], key)
        mine = ours["spec"]["containers"][0]
        self.assertEqual(mine["securityContext"],
                         workers["spec"]["containers"][0]["securityContext"])
        self.assertEqual(mine["readinessProbe"],
                         servers["spec"]["containers"][0]["readinessProbe"])
        self.assertEqual(mine["ports"], servers["spec"]["containers"][0]["ports"])

    def test_jobset_sizes_written_once(self):
        # Change the two sizes in sizes.yaml only: everything follows.
        with open(os.path.join(self.deploy, "jobset", "sizes.yaml")) as f:
            sizes = f.read()
        try:
            with open(os.path.join(self.deploy, "jobset", "sizes.yaml"), "w") as f:
                f.write(sizes.replace('shards: "2"', 'shards: "3"')
                        .replace('workers: "4"', 'workers: "5"'))
            text = self.kustomize("jobset")
        finally:
            with open(os.path.join(self.deploy, "jobset", "sizes.yaml"), "w") as f:
                f.write(sizes)
        docs = [d for d in yaml.safe_load_all(text) if d]
        self.assertNotIn("bnps-sizes", [d["metadata"]["name"] for d in docs])  # local-config
        jobset = _jobset_doc(text)
        for name, size in (("servers", 3), ("workers", 5)):
            spec = _rjob(jobset, name)["template"]["spec"]
            self.assertEqual((spec["completions"], spec["parallelism"]), (size, size))
        data = {d["metadata"]["name"].rsplit("-", 1)[0]: d["data"]
                for d in docs if d["kind"] == "ConfigMap"}
        self.assertEqual(data["bnps-server"]["BNPS_NUM_SHARDS"], "3")
        self.assertEqual(data["bnps-server"]["BNPS_NUM_WORKERS"], "5")
        self.assertEqual(data["bnps-worker"]["BNPS_NUM_WORKERS"], "5")
        self.assertEqual(data["bnps-worker"]["NUM_SERVERS"], "3")
        # No placeholder is left anywhere.
        self.assertNotIn("set-by-kustomize", text)
        # And the Pods the controllers would make.
        renderer = to_pods.Renderer(docs, os.path.join(self.tmp.name, "pods"), "10.89.3")
        renderer.render()
        self.assertEqual(len(renderer.servers), 3)
        self.assertEqual(len(renderer.workers), 5)
        self.assertEqual(
            [e["value"] for e in renderer.servers[2]["spec"]["containers"][0]["env"]
             if e["name"] == "BNPS_SHARD"], ["2"])

    def test_kueue_queue_written_once(self):
        # Kueue admits a JobSet or a TrainJob by its queue-name label, which
        # must name a LocalQueue (a DNS-1123 subdomain, at most 63 as a label).
        label = "kueue.x-k8s.io/queue-name"
        name = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")
        path = os.path.join(self.deploy, "jobset", "sizes.yaml")
        with open(path) as f:
            sizes = f.read()
        self.assertIn('queue: "bnps"', sizes)
        try:
            with open(path, "w") as f:
                f.write(sizes.replace('queue: "bnps"', 'queue: "team-a"'))
            text = self.kustomize("jobset")
        finally:
            with open(path, "w") as f:
                f.write(sizes)
        self.assertEqual(_jobset_doc(text)["metadata"]["labels"][label], "team-a")
        for overlay in ("jobset", "jobset-tls"):
            labels = _jobset_doc(self.rendered[overlay])["metadata"]["labels"]
            self.assertRegex(labels[label], name, overlay)
        jobs = [d for d in yaml.safe_load_all(self.rendered["kubeflow"])
                if d and d["kind"] == "TrainJob"]
        self.assertEqual(len(jobs), 1)
        self.assertRegex(jobs[0]["metadata"]["labels"][label], name)
        # Only the jobs carry it: Kueue would otherwise try to admit pods.
        for overlay in ("jobset", "kubeflow"):
            for d in yaml.safe_load_all(self.rendered[overlay]):
                if d and d["kind"] not in ("JobSet", "TrainJob"):
                    self.assertNotIn(label, d["metadata"].get("labels", {}),
                                     (overlay, d["kind"]))

    def test_kueue_local_queue_is_the_one_the_jobs_name(self):
        label = "kueue.x-k8s.io/queue-name"
        queues = [d for d in yaml.safe_load_all(self.rendered["kueue"])
                  if d and d["kind"] == "LocalQueue"]
        self.assertEqual(len(queues), 1)
        name = queues[0]["metadata"]["name"]
        self.assertEqual(
            _jobset_doc(self.rendered["jobset"])["metadata"]["labels"][label],
            name)
        jobs = [d for d in yaml.safe_load_all(self.rendered["kubeflow"])
                if d and d["kind"] == "TrainJob"]
        self.assertEqual(jobs[0]["metadata"]["labels"][label], name)
        queue = self.rendered["kueue"]
        self.assert_invalid([
            (queue.replace("clusterQueue: cluster-queue",
                           "clusterQueue: Cluster_Queue"),
             "spec.clusterQueue: 'Cluster_Queue' does not match"),
            (queue.replace("clusterQueue: cluster-queue",
                           "clusterQueue: cluster-queue\n  stopPolicy: Pause"),
             "'Pause' is not one of"),
            (queue.replace("clusterQueue:", "clusterQueues:"),
             "'clusterQueues' was unexpected"),
        ], lambda message: queue)

    def test_jobset_names_resolved_inside_the_jobset(self):
        # kustomize renames generated ConfigMaps and Secrets (hash suffix) and
        # labels pod templates; kustomizeconfig.yaml tells it where, in a
        # JobSet. Every name the JobSet uses is an object that exists.
        for overlay in ("jobset", "jobset-tls"):
            docs = [d for d in yaml.safe_load_all(self.rendered[overlay]) if d]
            names = {d["metadata"]["name"] for d in docs}
            for rjob in _jobset_doc(self.rendered[overlay])["spec"]["replicatedJobs"]:
                pod = rjob["template"]["spec"]["template"]
                self.assertEqual(pod["metadata"]["labels"]["app.kubernetes.io/part-of"], "bnps")
                for c in pod["spec"]["containers"]:
                    for ref in c["envFrom"]:
                        self.assertIn(ref["configMapRef"]["name"], names)
                for v in pod["spec"]["volumes"]:
                    self.assertIn(v["secret"]["secretName"], names)
                    self.assertNotEqual(v["secret"]["secretName"], v["name"])

    def test_jobset_pods_match_base(self):
        # The same probes, security settings, resources and scrape
        # annotations as deploy/base's StatefulSet and Job (TLS: deploy/tls's).
        for jobset_overlay, base_overlay in (("jobset", "base"), ("jobset-tls", "tls")):
            base = {d["kind"]: d for d in yaml.safe_load_all(self.rendered[base_overlay]) if d}
            jobset = _jobset_doc(self.rendered[jobset_overlay])
            for rjob, kind in (("servers", "StatefulSet"), ("workers", "Job")):
                with self.subTest(overlay=jobset_overlay, pods=rjob):
                    ours = _rjob(jobset, rjob)["template"]["spec"]["template"]
                    theirs = base[kind]["spec"]["template"]
                    self.assertEqual(ours["metadata"]["annotations"],
                                     theirs["metadata"]["annotations"])
                    for key in ("securityContext", "enableServiceLinks",
                                "terminationGracePeriodSeconds"):
                        self.assertEqual(ours["spec"].get(key), theirs["spec"].get(key), key)
                    mine, base_c = ours["spec"]["containers"][0], theirs["spec"]["containers"][0]
                    for key in ("readinessProbe", "livenessProbe", "securityContext",
                                "resources", "ports", "image", "imagePullPolicy"):
                        self.assertEqual(mine.get(key), base_c.get(key), key)

    def test_jobset_tls_matches_base_tls(self):
        # The same TLS variables and probes as deploy/tls, on the JobSet.
        jobset = _jobset_doc(self.rendered["jobset-tls"])
        server = _rjob(jobset, "servers")["template"]["spec"]["template"]["spec"][
            "containers"][0]
        self.assertEqual(server["readinessProbe"]["tcpSocket"], {"port": 7000})
        self.assertNotIn("grpc", server["livenessProbe"])
        self.assertIn("/etc/bnps/tls", [m["mountPath"] for m in server["volumeMounts"]])
        tls_vars = lambda text: sorted(
            k for d in yaml.safe_load_all(text) if d and d["kind"] == "ConfigMap"
            for k in d["data"] if k.startswith("BNPS_TLS"))
        self.assertEqual(tls_vars(self.rendered["jobset-tls"]), tls_vars(self.rendered["tls"]))


if __name__ == "__main__":
    unittest.main()
