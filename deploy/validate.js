#!/usr/bin/env node
// Validates Kubernetes manifests against the Kubernetes OpenAPI schemas,
// offline (no cluster): every object of every YAML stream given (files, or
// stdin for "-") must be of a known apiVersion and kind and pass its model's
// validate(). One line per object; exit status 1 if any fails.
//
//   kubectl kustomize deploy/base | node deploy/validate.js -
//
// Needs `npm ci` in deploy/ (package.json pins kubernetes-models and js-yaml).
'use strict';
const fs = require('fs');
const yaml = require('js-yaml');

function modelOf(apiVersion, kind) {
  // "v1" is the core group (kubernetes-models/v1/Service); "apps/v1" others.
  const path = `kubernetes-models/${apiVersion}/${kind}`;
  try {
    return require(path)[kind];
  } catch (e) {
    return null;
  }
}

let failed = 0;
let checked = 0;
const inputs = process.argv.slice(2);
if (inputs.length === 0) inputs.push('-');
for (const input of inputs) {
  const text = fs.readFileSync(input === '-' ? 0 : input, 'utf8');
  for (const doc of yaml.loadAll(text)) {
    if (doc === null || doc === undefined) continue;
    const what = `${doc.kind}/${doc.metadata && doc.metadata.name}`;
    const Model = modelOf(doc.apiVersion, doc.kind);
    checked++;
    if (!Model) {
      console.log(`INVALID ${what}: no schema for ${doc.apiVersion} ${doc.kind}`);
      failed++;
      continue;
    }
    // kustomize wraps long base64 values over lines; the API server's decoder
    // (Go's base64) skips line breaks, the schema's "byte" format does not.
    if (doc.kind === 'Secret' && doc.data) {
      for (const k of Object.keys(doc.data)) {
        doc.data[k] = String(doc.data[k]).replace(/[\r\n]/g, '');
      }
    }
    try {
      new Model(doc).validate();
      console.log(`valid ${doc.apiVersion} ${what}`);
    } catch (e) {
      console.log(`INVALID ${what}: ${e.message}`);
      failed++;
    }
  }
}
if (checked === 0) {
  console.log('no objects to validate');
  process.exit(1);
}
console.log(`${checked - failed} of ${checked} objects valid`);
process.exit(failed ? 1 : 0);
