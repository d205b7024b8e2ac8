#!/usr/bin/env node
// Validates Kubernetes manifests against the Kubernetes API schemas, offline:
//  - kubernetes-models: JSON schemas generated from the Kubernetes OpenAPI spec (types, required fields, enums,
//    int32/int-or-string formats), compiled with ajv;
//  - TypeScript, on the same package's interfaces (generated from the same spec): unknown fields at any depth,
//    which the JSON schemas accept (like `kubectl apply --validate=strict` rejects them).
// YAML is parsed as YAML 1.1 with unique keys, as the API server's sigs.k8s.io/yaml does (0440 is octal).
//
// usage: validate_manifests.js --modules DIR --work DIR [--expect-invalid] PATH...
//   PATH: a .yaml file or a directory of them. kustomization.yaml files get their resources checked for existence.
//   --expect-invalid: every file must be rejected (and with the text of its "# expect-error: ..." line, if any).
'use strict';
const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');

function parseArgs(argv) {
  const args = { modules: null, work: null, expectInvalid: false, paths: [] };
  for (let i = 0; i < argv.length; ++i) {
    if (argv[i] === '--modules') args.modules = argv[++i];
    else if (argv[i] === '--work') args.work = argv[++i];
    else if (argv[i] === '--expect-invalid') args.expectInvalid = true;
    else args.paths.push(argv[i]);
  }
  if (!args.modules || !args.work || args.paths.length === 0) {
    console.error('usage: validate_manifests.js --modules DIR --work DIR [--expect-invalid] PATH...');
    process.exit(2);
  }
  return args;
}

const args = parseArgs(process.argv.slice(2));
// The node modules live in the build directory (npm ci there), not next to this script.
const req = createRequire(path.join(path.resolve(args.modules), 'node_modules', 'noop.js'));
const YAML = req('yaml');
const ts = req('typescript');

function listFiles(p) {
  if (fs.statSync(p).isDirectory()) {
    return fs.readdirSync(p).filter((f) => /\.ya?ml$/.test(f)).sort().map((f) => path.join(p, f));
  }
  return [p];
}

function describe(doc) {
  const name = doc && doc.metadata && doc.metadata.name;
  return `${doc && doc.kind}/${name || '?'}`;
}

// The kubernetes-models module of an apiVersion/kind: apps/v1 StatefulSet -> kubernetes-models/apps/v1/StatefulSet.
function modelModule(doc) {
  if (typeof doc.apiVersion !== 'string' || typeof doc.kind !== 'string' || !/^[A-Za-z0-9]+$/.test(doc.kind)) {
    return null;
  }
  const id = `kubernetes-models/${doc.apiVersion}/${doc.kind}`;
  try {
    const mod = req(id);
    return mod[doc.kind] ? { id, Model: mod[doc.kind] } : null;
  } catch (e) {
    return null;
  }
}

function checkKustomization(file, doc, report) {
  for (const r of doc.resources || []) {
    if (!fs.existsSync(path.resolve(path.dirname(file), r))) report(`resource ${r} does not exist`);
  }
}

// Validates one file; returns its error messages. Documents for the TypeScript pass are appended to `typed`.
function validateFile(file, typed) {
  const errors = [];
  let docs;
  try {
    docs = YAML.parseAllDocuments(fs.readFileSync(file, 'utf8'), { version: '1.1', uniqueKeys: true });
  } catch (e) {
    return [`${file}: ${e.message}`];
  }
  docs.forEach((d, i) => {
    const where = `${file}[${i}]`;
    if (d.errors.length) {
      d.errors.forEach((e) => errors.push(`${where}: YAML: ${e.message}`));
      return;
    }
    const doc = d.toJS();
    if (doc === null) return;  // empty document, e.g. after a trailing ---
    const report = (msg) => errors.push(`${where} ${describe(doc)}: ${msg}`);
    if (typeof doc.apiVersion === 'string' && doc.apiVersion.startsWith('kustomize.config.k8s.io/')) {
      checkKustomization(file, doc, report);
      return;
    }
    const model = modelModule(doc);
    if (!model) {
      report(`unknown apiVersion/kind ${doc.apiVersion}/${doc.kind}`);
      return;
    }
    try {
      new model.Model(doc).validate();
    } catch (e) {
      const details = (e.errors || []).map((x) => `${x.instancePath || '/'} ${x.message}`);
      report(`schema: ${details.length ? details.join('; ') : e.message}`);
    }
    typed.push({ where: `${where} ${describe(doc)}`, id: model.id, kind: doc.kind, doc, errors });
  });
  return errors;
}

// One TypeScript file assigning every document, as an object literal, to its interface: excess property checks
// report unknown fields, assignability reports wrong types. Diagnostics are mapped back to their documents.
function typeCheck(typed, workDir, modulesDir) {
  if (typed.length === 0) return;
  fs.mkdirSync(workDir, { recursive: true });
  const lines = [];
  const owner = [];  // owner[line] = index into typed
  typed.forEach((t, i) => {
    const text = [`import type { I${t.kind} as T${i} } from ${JSON.stringify(t.id)};`,
      `export const doc${i}: T${i} = ${JSON.stringify(t.doc, null, 2)};`].join('\n').split('\n');
    text.forEach((l) => { lines.push(l); owner.push(i); });
  });
  const file = path.join(workDir, 'manifests.ts');
  fs.writeFileSync(file, lines.join('\n') + '\n');
  const program = ts.createProgram([file], {
    noEmit: true,
    strict: false,  // null is allowed for optional fields, as the API server allows it
    skipLibCheck: true,
    types: [],
    target: ts.ScriptTarget.ES2020,
    module: ts.ModuleKind.CommonJS,
    moduleResolution: ts.ModuleResolutionKind.Node10,
    // The work directory is not below the node modules: resolve the models' imports there.
    baseUrl: path.join(path.resolve(modulesDir), 'node_modules'),
    paths: { '*': ['*'] },
  });
  const CANNOT_FIND_MODULE = 2307;
  for (const diag of ts.getPreEmitDiagnostics(program)) {
    const message = ts.flattenDiagnosticMessageText(diag.messageText, ' ');
    // A broken setup must fail loudly, not count as the rejection of a manifest.
    if (!diag.file || path.resolve(diag.file.fileName) !== path.resolve(file) || diag.code === CANNOT_FIND_MODULE) {
      throw new Error(`TypeScript setup: ${message}`);
    }
    const line = diag.file.getLineAndCharacterOfPosition(diag.start).line;
    const t = typed[owner[line]];
    t.errors.push(`${t.where}: type: ${message} (at: ${lines[line].trim()})`);
  }
}

function main() {
  const files = args.paths.flatMap(listFiles);
  if (files.length === 0) {
    console.error('no manifests found');
    return 1;
  }
  const results = files.map((file) => {
    const typed = [];
    const errors = validateFile(file, typed);
    return { file, typed, errors };
  });
  // One TypeScript program for everything (cheaper); errors land in the arrays of their files.
  typeCheck(results.flatMap((r) => r.typed), path.join(args.work, 'ts'), args.modules);

  let failed = 0;
  for (const r of results) {
    if (!args.expectInvalid) {
      r.errors.forEach((e) => console.log(`INVALID ${e}`));
      if (r.errors.length) failed++;
      else console.log(`ok ${r.file} (${r.typed.length} objects)`);
      continue;
    }
    const expected = (fs.readFileSync(r.file, 'utf8').match(/^# expect-error: (.+)$/m) || [])[1];
    const matched = expected ? r.errors.some((e) => e.includes(expected.trim())) : r.errors.length > 0;
    if (matched) {
      console.log(`ok ${r.file} rejected: ${r.errors.join(' | ')}`);
    } else {
      failed++;
      console.log(`UNEXPECTED ${r.file}: ${r.errors.length ? `rejected without "${expected}": ${r.errors.join(' | ')}`
                                                           : 'accepted'}`);
    }
  }
  console.log(`${results.length - failed} passed, ${failed} failed`);
  return failed ? 1 : 0;
}

process.exitCode = main();
