#!/opt/bnps-venv/bin/python3
"""Validates rendered Kubernetes manifests offline (no cluster).

    kubectl kustomize deploy/jobset | deploy/validate.py -

Every object of every YAML stream given (files, or "-" for stdin) must pass:
  - a built-in kind: Kubernetes' own OpenAPI schema, as JSON schema, from the
    pinned kubernetes-validate package, in strict mode (an unknown field is an
    error, so a misspelt one is found);
  - a JobSet (jobset.x-k8s.io/v1alpha2): our structural schema of its API
    (deploy/schemas/jobset-v1alpha2.json, written from the API's Go types:
    every spec field's type, enums and bounds, the required ones), then each
    Job template inside it against Kubernetes' batch/v1 Job schema and each
    claim template against the PersistentVolumeClaim schema, then the rules
    the controller's webhook would enforce on names (successPolicy and
    failurePolicy targets, dependsOn and the coordinator name replicated jobs
    that exist; replicated job names unique);
  - a Kubeflow Trainer TrainJob, ClusterTrainingRuntime or TrainingRuntime
    (trainer.kubeflow.org/v1alpha1): Trainer's own CRD schemas, made strict
    (deploy/schemas/trainer-v1alpha1-*.json); a runtime's JobSet template
    then as a JobSet above, and, with a torch policy, the replicated
    job "node" whose pods carry the label
    trainer.kubeflow.org/trainjob-ancestor-step=trainer and a container
    "node" (where Trainer puts a TrainJob's trainer settings and PET_*).
Anything else is invalid: there is no schema to say it is right.

One line per object; the last line counts them. Exit status 0 when all are
valid, 1 otherwise, 2 on a bad argument or unreadable input. Runs in the
virtual environment tools/setup.sh --containers makes (/opt/bnps-venv,
deploy/requirements.txt).
"""

import argparse
import json
import os
import sys

import jsonschema
import kubernetes_validate
import yaml

# The Kubernetes release whose schemas are used; --kubernetes-version changes it.
DEFAULT_KUBERNETES_VERSION = "1.32"

_SCHEMA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemas")
# apiVersion, kind -> our schema file (deploy/schemas/).
CUSTOM_SCHEMAS = {
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset-v1alpha2.json",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer-v1alpha1-trainjob.json",
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): "trainer-v1alpha1-runtime.json",
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): "trainer-v1alpha1-runtime.json",
    ("kueue.x-k8s.io/v1beta2", "LocalQueue"): "kueue-v1beta2-localqueue.json",
}
_JOBSET = ("jobset.x-k8s.io/v1alpha2", "JobSet")
# Where Trainer finds the trainer's pods and container (its constants.go).
_TRAINER_JOB = _TRAINER_CONTAINER = "node"
_ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"


def _where(error):
    path = ".".join(str(p) for p in error.absolute_path)
    return "%s: %s" % (path or "(top)", error.message)


class Validator:
    """Checks objects; each check returns a list of problems (empty: valid)."""

    def __init__(self, kubernetes_version):
        self.kubernetes_version = kubernetes_version
        self._custom = {}

    def problems(self, doc):
        if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
            return ["not a Kubernetes object (no apiVersion or kind)"]
        key = (doc["apiVersion"], doc["kind"])
        if key in CUSTOM_SCHEMAS:
            return self._custom_problems(doc, key)
        return self._kubernetes_problems(doc)

    def _kubernetes_problems(self, doc, what=""):
        doc = _without_wrapped_base64(doc)
        try:
            kubernetes_validate.validate(doc, self.kubernetes_version, strict=True)
        except kubernetes_validate.ValidationError as e:
            return [what + _where(e)]
        except kubernetes_validate.SchemaNotFoundError:
            return ["%sno schema for %s %s in Kubernetes %s"
                    % (what, doc.get("apiVersion"), doc.get("kind"), self.kubernetes_version)]
        return []

    def _schema(self, file_name):
        if file_name not in self._custom:
            with open(os.path.join(_SCHEMA_DIR, file_name)) as f:
                schema = json.load(f)
            jsonschema.Draft202012Validator.check_schema(schema)
            self._custom[file_name] = jsonschema.Draft202012Validator(schema)
        return self._custom[file_name]

    def _custom_problems(self, doc, key):
        validator = self._schema(CUSTOM_SCHEMAS[key])
        found = [_where(e) for e in sorted(validator.iter_errors(doc), key=str)]
        if found:
            return found  # the embedded objects may not even be where we look
        if key == _JOBSET:
            return self._job_set_problems(doc["spec"], "spec.")
        if key[1].endswith("TrainingRuntime"):
            return self._runtime_problems(doc["spec"])
        return []

    def _runtime_problems(self, spec):
        """A Trainer runtime's JobSet template, and its trainer node."""
        template = spec.get("template") or {}
        jobset = {"apiVersion": _JOBSET[0], "kind": _JOBSET[1],
                  "metadata": dict(template.get("metadata") or {}, name="runtime"),
                  "spec": template.get("spec") or {}}
        at = "spec.template.spec."
        found = ["spec.template.%s" % e for e in (
            _where(e) for e in sorted(self._schema(CUSTOM_SCHEMAS[_JOBSET]).iter_errors(
                jobset), key=str))]
        if found:
            return found
        found = self._job_set_problems(jobset["spec"], at)
        policy = spec.get("mlPolicy") or {}
        if "torch" not in policy:
            return found
        nodes = [r for r in jobset["spec"]["replicatedJobs"] if r["name"] == _TRAINER_JOB]
        if not nodes:
            return found + ["%sreplicatedJobs: no replicated job named %s (Trainer's "
                            "trainer nodes)" % (at, _TRAINER_JOB)]
        job = nodes[0]["template"]
        if ((job.get("metadata") or {}).get("labels") or {}).get(_ANCESTOR) != "trainer":
            found.append("%sreplicatedJobs[name=%s].template.metadata.labels: no %s: trainer "
                         "(Trainer would not find the trainer nodes)"
                         % (at, _TRAINER_JOB, _ANCESTOR))
        pod = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
        if _TRAINER_CONTAINER not in [c.get("name") for c in pod.get("containers") or []]:
            found.append("%sreplicatedJobs[name=%s]: no container named %s (where Trainer "
                         "puts the TrainJob's trainer settings and PET_* variables)"
                         % (at, _TRAINER_JOB, _TRAINER_CONTAINER))
        return found

    def _job_set_problems(self, spec, at):
        """A JobSet spec's embedded objects and cross-references."""
        found = []
        names = [r["name"] for r in spec["replicatedJobs"]]
        if len(set(names)) != len(names):
            found.append("%sreplicatedJobs: names not unique: %s" % (at, names))
        for i, rjob in enumerate(spec["replicatedJobs"]):
            template = rjob["template"]
            job = {"apiVersion": "batch/v1", "kind": "Job",
                   "metadata": dict(template.get("metadata") or {}, name=rjob["name"]),
                   "spec": template.get("spec", {})}
            found += self._kubernetes_problems(job, "%sreplicatedJobs.%d.template (a Job): "
                                               % (at, i))
            for dep in rjob.get("dependsOn", []):
                if dep["name"] not in names[:i]:
                    found.append("%sreplicatedJobs.%d.dependsOn: %s is not an earlier "
                                 "replicated job" % (at, i, dep["name"]))
        refs = [("successPolicy", (spec.get("successPolicy") or {}).get(
            "targetReplicatedJobs") or [])]
        for k, rule in enumerate((spec.get("failurePolicy") or {}).get("rules") or []):
            refs.append(("failurePolicy.rules.%d" % k, rule.get("targetReplicatedJobs") or []))
        if "coordinator" in spec:
            refs.append(("coordinator", [spec["coordinator"]["replicatedJob"]]))
        for where, targets in refs:
            for t in targets:
                if t not in names:
                    found.append("%s%s: no replicated job named %s (have %s)"
                                 % (at, where, t, ", ".join(names)))
        for p, policy in enumerate(spec.get("volumeClaimPolicies") or []):
            for t, claim in enumerate(policy.get("templates") or []):
                pvc = dict(claim, apiVersion="v1", kind="PersistentVolumeClaim")
                found += self._kubernetes_problems(
                    pvc, "%svolumeClaimPolicies.%d.templates.%d (a PersistentVolumeClaim): "
                    % (at, p, t))
        return found


def _without_wrapped_base64(doc):
    # kustomize wraps long base64 values over lines; the API server's decoder
    # (Go's base64) skips line breaks, the schema's "byte" format does not.
    if doc.get("kind") != "Secret" or not doc.get("data"):
        return doc
    doc = dict(doc)
    doc["data"] = {k: "".join(str(v).split()) for k, v in doc["data"].items()}
    return doc


def _name(doc):
    if not isinstance(doc, dict):
        return "?"
    return "%s/%s" % (doc.get("kind"), (doc.get("metadata") or {}).get("name"))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("inputs", nargs="*", default=["-"], help="YAML files; - is stdin")
    parser.add_argument("--kubernetes-version", default=DEFAULT_KUBERNETES_VERSION,
                        help="the Kubernetes release whose schemas to use (default %(default)s)")
    args = parser.parse_args(argv[1:])
    validator = Validator(args.kubernetes_version)
    checked = failed = 0
    for source in args.inputs or ["-"]:
        try:
            text = sys.stdin.read() if source == "-" else open(source).read()
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
        except (OSError, yaml.YAMLError) as e:
            print("validate.py: %s: %s" % (source, e), file=sys.stderr)
            return 2
        for doc in docs:
            checked += 1
            found = validator.problems(doc)
            if found:
                failed += 1
                for problem in found:
                    print("INVALID %s: %s" % (_name(doc), problem))
            else:
                print("valid %s %s" % (doc["apiVersion"], _name(doc)))
    if checked == 0:
        print("no objects to validate")
        return 1
    print("%d of %d objects valid (Kubernetes %s schemas)"
          % (checked - failed, checked, args.kubernetes_version))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
