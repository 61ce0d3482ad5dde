#!/usr/bin/env node
// Renders the kustomized manifests as the Pods Kubernetes would create from
// them, for `podman kube play` (which runs Pods but not StatefulSets or Jobs).
// tools/container_test.sh uses it to run the manifests' containers here.
//
//   kubectl kustomize deploy/base | node deploy/to_pods.js - OUT_DIR SUBNET_PREFIX
//
// What it does as the controllers and the kubelet would:
//   StatefulSet NAME, replicas R -> Pods NAME-0 .. NAME-(R-1), each with
//     hostname NAME-i and subdomain = serviceName (so BNPS_SHARD=from-hostname
//     sees NAME-i), and a volume per volumeClaimTemplate.
//   Indexed Job NAME, completions C -> Pods NAME-0 .. NAME-(C-1), each with
//     JOB_COMPLETION_INDEX=i in its containers' environment.
//   envFrom configMapRef -> the ConfigMap's entries as env (podman kube play
//     would need each ConfigMap as a separate file).
//   secret volumes -> hostPath directories holding the Secret's files.
//   persistentVolumeClaim templates -> hostPath directories (a fresh volume).
// What differs, because there is no cluster: the headless Service's DNS names
// (NAME-i.SERVICE) are hostAliases of the worker Pods, to fixed addresses
// SUBNET_PREFIX.(10+k) on the podman network (pass them to podman kube play as
// --ip, in the order of servers.yaml); probes are dropped (podman 4.3 has no
// gRPC probe and runs a tcpSocket probe as a command the image lacks;
// container_test.sh asks the servers itself what the probes would); ports
// are dropped (podman 4.3 would publish each on the host).
//
// Writes OUT_DIR/servers.yaml (the StatefulSets' Pods), OUT_DIR/workers.yaml
// (the Jobs' Pods), OUT_DIR/ips (one address per server Pod, in order) and the
// Secrets' files and volume directories under OUT_DIR.
'use strict';
const fs = require('fs');
const path = require('path');
const yaml = require('js-yaml');

const [input, outDir, subnetPrefix] = process.argv.slice(2);
if (!input || !outDir || !subnetPrefix) {
  console.error('usage: to_pods.js MANIFESTS|- OUT_DIR SUBNET_PREFIX (e.g. 10.89.77)');
  process.exit(2);
}
const docs = yaml.loadAll(fs.readFileSync(input === '-' ? 0 : input, 'utf8'))
    .filter((d) => d);
const byKind = (kind) => docs.filter((d) => d.kind === kind);
const configMaps = Object.fromEntries(
    byKind('ConfigMap').map((c) => [c.metadata.name, c.data || {}]));
const secrets = Object.fromEntries(
    byKind('Secret').map((s) => [s.metadata.name, s.data || {}]));

function fail(message) {
  console.error(`to_pods.js: ${message}`);
  process.exit(1);
}

// A directory the Pod's user may read (and write, for volumes).
function ownedDir(dir, uid, gid) {
  fs.mkdirSync(dir, {recursive: true, mode: 0o750});
  if (process.getuid && process.getuid() === 0) fs.chownSync(dir, uid, gid);
}

function secretDir(name, uid, gid) {
  const data = secrets[name];
  if (!data) fail(`no Secret ${name} in the manifests`);
  const dir = path.join(outDir, 'secrets', name);
  ownedDir(dir, uid, gid);
  for (const [key, value] of Object.entries(data)) {
    const file = path.join(dir, key);
    fs.writeFileSync(file, Buffer.from(String(value).replace(/\s/g, ''), 'base64'),
        {mode: 0o440});
    if (process.getuid && process.getuid() === 0) fs.chownSync(file, uid, gid);
  }
  return dir;
}

// The Pod spec Kubernetes would run for this template, made playable.
function podSpec(template, podName, extraEnv, claimDirs) {
  const spec = JSON.parse(JSON.stringify(template.spec));
  const sc = spec.securityContext || {};
  const uid = sc.runAsUser || 0;
  const gid = sc.fsGroup || sc.runAsGroup || 0;
  for (const c of spec.containers) {
    const env = [];
    for (const from of c.envFrom || []) {
      if (!from.configMapRef) fail(`${podName}: only configMapRef envFrom is rendered`);
      const data = configMaps[from.configMapRef.name];
      if (!data) fail(`no ConfigMap ${from.configMapRef.name} in the manifests`);
      for (const [k, v] of Object.entries(data)) env.push({name: k, value: String(v)});
    }
    delete c.envFrom;
    // podman 4.3 publishes a containerPort on the host's same port, so two
    // servers' 7000 would clash; Pods reach each other over the network.
    delete c.ports;
    // Variables of the container itself come after (and beat) envFrom's.
    c.env = env.concat(c.env || [], extraEnv);
    // Probes are dropped (see the top).
    for (const probe of ['readinessProbe', 'livenessProbe', 'startupProbe']) {
      delete c[probe];
    }
  }
  for (const v of spec.volumes || []) {
    if (v.secret) {
      v.hostPath = {path: path.resolve(secretDir(v.secret.secretName, uid, gid)),
                    type: 'Directory'};
      delete v.secret;
    }
  }
  for (const [claim, dir] of Object.entries(claimDirs)) {
    ownedDir(dir, uid, gid);
    spec.volumes = (spec.volumes || []).concat(
        [{name: claim, hostPath: {path: path.resolve(dir), type: 'Directory'}}]);
  }
  return spec;
}

function pod(name, labels, spec) {
  return {apiVersion: 'v1', kind: 'Pod', metadata: {name, labels}, spec};
}

fs.mkdirSync(outDir, {recursive: true});
const servers = [];
const ips = [];
const aliases = [];
for (const set of byKind('StatefulSet')) {
  const replicas = set.spec.replicas === undefined ? 1 : set.spec.replicas;
  for (let i = 0; i < replicas; i++) {
    const name = `${set.metadata.name}-${i}`;
    const claims = {};
    for (const t of set.spec.volumeClaimTemplates || []) {
      claims[t.metadata.name] = path.join(outDir, 'volumes', `${t.metadata.name}-${name}`);
    }
    const spec = podSpec(set.spec.template, name, [], claims);
    spec.hostname = name;
    spec.subdomain = set.spec.serviceName;
    servers.push(pod(name, set.spec.template.metadata.labels, spec));
    const ip = `${subnetPrefix}.${10 + ips.length}`;
    ips.push(ip);
    aliases.push({ip, hostnames: [`${name}.${set.spec.serviceName}`, name]});
  }
}
const workers = [];
for (const job of byKind('Job')) {
  if (job.spec.completionMode !== 'Indexed') fail(`Job ${job.metadata.name} is not Indexed`);
  for (let i = 0; i < job.spec.completions; i++) {
    const name = `${job.metadata.name}-${i}`;
    const spec = podSpec(job.spec.template, name,
        [{name: 'JOB_COMPLETION_INDEX', value: String(i)}], {});
    spec.hostAliases = aliases;
    workers.push(pod(name, job.spec.template.metadata.labels, spec));
  }
}
if (servers.length === 0 || workers.length === 0) fail('no StatefulSet or no Job');
const dump = (objs) => objs.map((o) => yaml.dump(o, {noRefs: true})).join('---\n');
fs.writeFileSync(path.join(outDir, 'servers.yaml'), dump(servers));
fs.writeFileSync(path.join(outDir, 'workers.yaml'), dump(workers));
fs.writeFileSync(path.join(outDir, 'ips'), ips.join('\n') + '\n');
console.log(`to_pods.js: ${servers.length} server pods, ${workers.length} worker pods`);
