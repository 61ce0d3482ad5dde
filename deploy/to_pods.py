#!/usr/bin/python3
"""Renders kustomized manifests as the Pods Kubernetes would create from them.

`podman kube play` runs Pods, not StatefulSets, Jobs or JobSets; this writes
the Pods their controllers would make, so tools/container_test.sh can run the
manifests' containers on one machine.

    kubectl kustomize deploy/jobset | deploy/to_pods.py - OUT_DIR SUBNET_PREFIX

What it does as the controllers and the kubelet would:
  StatefulSet NAME, replicas R -> Pods NAME-0 .. NAME-(R-1), hostname NAME-i,
    subdomain serviceName, a fresh volume per volumeClaimTemplate.
  Indexed Job NAME, completions C -> Pods NAME-0 .. NAME-(C-1).
  JobSet JS, replicatedJob RJ (replicas R, an Indexed Job of C completions)
    -> Pods JS-RJ-j-i (j < R, i < C), hostname the same (a cluster adds a
    random suffix to a Job's Pod names, not to their host names), subdomain
    network.subdomain or JS; the labels and annotations the JobSet controller
    puts on them (jobset.sigs.k8s.io/jobset-name, replicatedjob-name,
    job-index, ...); one directory per volumeClaimPolicies template, shared
    by the Pods that mount it.
  Every Job's Pod: JOB_COMPLETION_INDEX=i and the completion-index annotation.
  envFrom configMapRef, env valueFrom configMapKeyRef and fieldRef (metadata.
    name, namespace, labels['K'], annotations['K']) -> literal values.
  subPathExpr -> its directory of the volume ($(VAR) from the container's env).
  Secret volumes -> host directories holding the Secret's files; claims ->
    host directories (fresh volumes), owned by the Pod's runAsUser/fsGroup.
What differs, because there is no cluster: names under a headless Service
(HOST.SUBDOMAIN) are hostAliases, in the worker Pods, to fixed addresses
SUBNET_PREFIX.(10+k) of the server Pods (pass them to podman kube play as
--ip, in the order of servers.yaml); probes are dropped (podman 4.3 has no
gRPC probe and runs a tcpSocket probe as a command the image lacks;
container_test.sh asks the servers itself); ports are dropped (podman 4.3
would publish each on the host).

Servers are the Pods that others reach by name: a StatefulSet's, and a
JobSet's replicatedJobs outside its successPolicy's targetReplicatedJobs.
Workers are a Job's and the JobSet's targets (the Pods that finish the job).

Writes OUT_DIR/servers.yaml, OUT_DIR/workers.yaml, OUT_DIR/ips (one address
per server Pod, in order), OUT_DIR/server-pods and worker-pods (the Pods'
names, one a line), and the Secrets' files and volume directories under
OUT_DIR. Needs Python 3 and PyYAML only. Exit status 1 on manifests it cannot
render, with the reason on stderr.
"""

import base64
import copy
import os
import re
import sys

import yaml

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


class RenderError(Exception):
    """A manifest this renderer cannot turn into Pods (the message says why)."""


def _owned_dir(path, uid, gid):
    """A directory the Pod's user may read and write (and its parents)."""
    os.makedirs(path, mode=0o750, exist_ok=True)
    if os.getuid() == 0:
        os.chown(path, uid, gid)
    return os.path.abspath(path)


class Renderer:
    """Turns parsed manifests into Pods; writes Secrets and volumes under out_dir."""

    def __init__(self, docs, out_dir, subnet_prefix):
        self.docs = [d for d in docs if d]
        self.out_dir = out_dir
        self.subnet_prefix = subnet_prefix
        self.config_maps = {d["metadata"]["name"]: d.get("data") or {}
                            for d in self._kind("ConfigMap")}
        self.secrets = {d["metadata"]["name"]: d.get("data") or {}
                        for d in self._kind("Secret")}
        self.servers = []   # Pods
        self.workers = []   # Pods
        self.ips = []       # one per server Pod
        self.aliases = []   # hostAliases of the worker Pods

    def _kind(self, kind):
        return [d for d in self.docs if d.get("kind") == kind]

    # --- what the controllers would create ------------------------------------

    def render(self):
        for sts in self._kind("StatefulSet"):
            self._stateful_set(sts)
        for job in self._kind("Job"):
            for i in range(self._completions(job["spec"], job["metadata"]["name"])):
                name = "%s-%d" % (job["metadata"]["name"], i)
                self.workers.append(self._pod(job["spec"]["template"], name, i, {}, {}, {}))
        for js in self._kind("JobSet"):
            self._job_set(js)
        if not self.servers or not self.workers:
            raise RenderError("no server Pods or no worker Pods in the manifests "
                              "(need a StatefulSet and a Job, or a JobSet with a successPolicy)")
        for pod in self.workers:
            pod["spec"]["hostAliases"] = copy.deepcopy(self.aliases)

    def _completions(self, job_spec, what):
        if job_spec.get("completionMode") != "Indexed":
            raise RenderError("Job %s is not Indexed" % what)
        return int(job_spec.get("completions", 1))

    def _add_server(self, pod, hostname, subdomain):
        ip = "%s.%d" % (self.subnet_prefix, 10 + len(self.ips))
        self.ips.append(ip)
        self.aliases.append({"ip": ip, "hostnames": ["%s.%s" % (hostname, subdomain), hostname]})
        self.servers.append(pod)

    def _stateful_set(self, sts):
        name, spec = sts["metadata"]["name"], sts["spec"]
        for i in range(int(spec.get("replicas", 1))):
            pod_name = "%s-%d" % (name, i)
            claims = {t["metadata"]["name"]: os.path.join(
                self.out_dir, "volumes", "%s-%s" % (t["metadata"]["name"], pod_name))
                for t in spec.get("volumeClaimTemplates", [])}
            pod = self._pod(spec["template"], pod_name, None, {}, {}, claims)
            pod["spec"]["hostname"] = pod_name
            pod["spec"]["subdomain"] = spec["serviceName"]
            self._add_server(pod, pod_name, spec["serviceName"])

    def _job_set(self, js):
        if js.get("apiVersion") != JOBSET_API:
            raise RenderError("JobSet %s: apiVersion %s, want %s"
                              % (js["metadata"]["name"], js.get("apiVersion"), JOBSET_API))
        name, spec = js["metadata"]["name"], js["spec"]
        network = spec.get("network") or {}
        subdomain = network.get("subdomain") or name
        dns = network.get("enableDNSHostnames", False)
        targets = (spec.get("successPolicy") or {}).get("targetReplicatedJobs") or []
        if not targets:
            raise RenderError("JobSet %s: no successPolicy.targetReplicatedJobs, so no "
                              "way to tell its workers from its servers" % name)
        # volumeClaimPolicies: one claim per template for the whole set,
        # named <claim>-<JobSet>, added to the Pods that mount it.
        shared = {}
        for policy in spec.get("volumeClaimPolicies", []):
            for t in policy.get("templates", []):
                claim = t["metadata"]["name"]
                shared[claim] = os.path.join(self.out_dir, "volumes", "%s-%s" % (claim, name))
        rjobs = spec["replicatedJobs"]
        global_replicas = sum(int(r.get("replicas", 1)) for r in rjobs)
        global_index = 0
        for rjob in rjobs:
            replicas = int(rjob.get("replicas", 1))
            job_spec = rjob["template"]["spec"]
            completions = self._completions(job_spec, "%s-%s" % (name, rjob["name"]))
            for j in range(replicas):
                meta = {
                    "jobset.sigs.k8s.io/jobset-name": name,
                    "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
                    "jobset.sigs.k8s.io/replicatedjob-replicas": str(replicas),
                    "jobset.sigs.k8s.io/job-index": str(j),
                    "jobset.sigs.k8s.io/job-global-index": str(global_index),
                    "jobset.sigs.k8s.io/global-replicas": str(global_replicas),
                    "jobset.sigs.k8s.io/restart-attempt": "0",
                }
                global_index += 1
                for i in range(completions):
                    pod_name = "%s-%s-%d-%d" % (name, rjob["name"], j, i)
                    pod = self._pod(job_spec["template"], pod_name, i, meta, meta, {},
                                    shared)
                    if dns:
                        pod["spec"]["hostname"] = pod_name
                        pod["spec"]["subdomain"] = subdomain
                    if rjob["name"] in targets:
                        self.workers.append(pod)
                    else:
                        self._add_server(pod, pod_name, subdomain)

    # --- one Pod ----------------------------------------------------------------

    def _pod(self, template, name, index, labels, annotations, claims, shared=None):
        """The Pod made from TEMPLATE, named NAME, playable by podman."""
        meta = copy.deepcopy(template.get("metadata") or {})
        labels = dict(meta.get("labels") or {}, **labels)
        annotations = dict(meta.get("annotations") or {}, **annotations)
        if index is not None:
            labels[_COMPLETION_INDEX] = str(index)
            annotations[_COMPLETION_INDEX] = str(index)
        pod_meta = {"name": name, "labels": labels, "annotations": annotations}
        spec = copy.deepcopy(template["spec"])
        sc = spec.get("securityContext") or {}
        uid = int(sc.get("runAsUser", 0))
        gid = int(sc.get("fsGroup", sc.get("runAsGroup", 0)))
        volumes = spec.setdefault("volumes", [])
        for v in volumes:
            if "secret" in v:
                v["hostPath"] = {"path": self._secret_dir(v["secret"]["secretName"], uid, gid),
                                 "type": "Directory"}
                del v["secret"]
        mounted = {m["name"] for c in spec["containers"] for m in c.get("volumeMounts", [])}
        for claim, path in sorted(claims.items()) + sorted((shared or {}).items()):
            if shared and claim in shared and claim not in mounted:
                continue  # the JobSet adds a shared claim only where it is mounted
            volumes.append({"name": claim, "hostPath": {"path": _owned_dir(path, uid, gid),
                                                       "type": "Directory"}})
        for c in spec["containers"]:
            env = []
            for source in c.pop("envFrom", []):
                if "configMapRef" not in source:
                    raise RenderError("%s: only configMapRef envFrom is rendered" % name)
                data = self._config_map(source["configMapRef"]["name"])
                env += [{"name": k, "value": str(v)} for k, v in data.items()]
            # The container's own variables come after (and beat) envFrom's.
            for e in c.get("env", []):
                env.append({"name": e["name"], "value": self._env_value(e, pod_meta, name)})
            if index is not None:
                env.append({"name": "JOB_COMPLETION_INDEX", "value": str(index)})
            c["env"] = env
            c.pop("ports", None)
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                c.pop(probe, None)
            self._expand_sub_paths(c, volumes, env, uid, gid, name)
        return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec}

    def _config_map(self, cm_name):
        if cm_name not in self.config_maps:
            raise RenderError("no ConfigMap %s in the manifests" % cm_name)
        return self.config_maps[cm_name]

    def _env_value(self, e, pod_meta, pod_name):
        if "value" in e:
            return str(e["value"])
        source = e.get("valueFrom") or {}
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            return str(self._config_map(ref["name"])[ref["key"]])
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            if path == "metadata.name":
                return pod_meta["name"]
            if path == "metadata.namespace":
                return "default"
            m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
            if m and m.group(2) in pod_meta[m.group(1)]:
                return pod_meta[m.group(1)][m.group(2)]
            raise RenderError("%s: %s: fieldRef %s is not rendered (or names nothing)"
                              % (pod_name, e["name"], path))
        raise RenderError("%s: %s: only value, configMapKeyRef and fieldRef are rendered"
                          % (pod_name, e["name"]))

    def _expand_sub_paths(self, container, volumes, env, uid, gid, pod_name):
        """A mount with subPathExpr becomes a host directory of its own."""
        values = {e["name"]: e["value"] for e in env}
        by_name = {v["name"]: v for v in volumes}
        for m in container.get("volumeMounts", []):
            expr = m.pop("subPathExpr", None)
            if expr is None:
                continue

            def var(match):
                if match.group(1) not in values:
                    raise RenderError("%s: subPathExpr %s: no variable %s"
                                      % (pod_name, expr, match.group(1)))
                return values[match.group(1)]
            sub = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", var, expr)
            if sub.startswith("/") or ".." in sub.split("/"):
                raise RenderError("%s: subPathExpr %s gives %s" % (pod_name, expr, sub))
            base = by_name.get(m["name"], {}).get("hostPath")
            if base is None:
                raise RenderError("%s: subPathExpr on volume %s, which is not a claim"
                                  % (pod_name, m["name"]))
            new_name = re.sub(r"[^a-z0-9-]", "-", ("%s-%s" % (m["name"], sub)).lower())
            volumes.append({"name": new_name, "hostPath": {
                "path": _owned_dir(os.path.join(base["path"], sub), uid, gid),
                "type": "Directory"}})
            m["name"] = new_name

    def _secret_dir(self, secret_name, uid, gid):
        if secret_name not in self.secrets:
            raise RenderError("no Secret %s in the manifests" % secret_name)
        path = _owned_dir(os.path.join(self.out_dir, "secrets", secret_name), uid, gid)
        for key, value in self.secrets[secret_name].items():
            f = os.path.join(path, key)
            # kustomize wraps long base64 over lines; Go's decoder skips them.
            with open(f, "wb") as out:
                out.write(base64.b64decode("".join(str(value).split())))
            os.chmod(f, 0o440)
            if os.getuid() == 0:
                os.chown(f, uid, gid)
        return path

    # --- output -------------------------------------------------------------------

    def write(self):
        os.makedirs(self.out_dir, exist_ok=True)
        for file_name, pods in (("servers.yaml", self.servers), ("workers.yaml", self.workers)):
            with open(os.path.join(self.out_dir, file_name), "w") as out:
                yaml.safe_dump_all(pods, out, sort_keys=False)
        lists = (("ips", self.ips),
                 ("server-pods", [p["metadata"]["name"] for p in self.servers]),
                 ("worker-pods", [p["metadata"]["name"] for p in self.workers]))
        for file_name, lines in lists:
            with open(os.path.join(self.out_dir, file_name), "w") as out:
                out.write("".join(line + "\n" for line in lines))


def main(argv):
    if len(argv) != 4:
        sys.stderr.write("usage: to_pods.py MANIFESTS|- OUT_DIR SUBNET_PREFIX (e.g. 10.89.77)\n")
        return 2
    _, source, out_dir, subnet_prefix = argv
    text = sys.stdin.read() if source == "-" else open(source).read()
    try:
        renderer = Renderer(list(yaml.safe_load_all(text)), out_dir, subnet_prefix)
        renderer.render()
        renderer.write()
    except (RenderError, KeyError, ValueError) as e:
        sys.stderr.write("to_pods.py: %s\n" % (e if not isinstance(e, KeyError)
                                                 else "missing field %s" % e))
        return 1
    print("to_pods.py: %d server pods, %d worker pods"
          % (len(renderer.servers), len(renderer.workers)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
