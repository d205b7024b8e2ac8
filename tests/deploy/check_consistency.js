#!/usr/bin/env node
// Cross-checks the deployment artefacts against each other, which no schema can: the config the pods read, the
// ports and paths the StatefulSet exposes and mounts, the memory budget against the container's limit, the drain
// deadline against the stop timeouts of Kubernetes and systemd, and the image's user against the pod's.
//
// usage: check_consistency.js --modules DIR DEPLOY_DIR
'use strict';
const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');

const argv = process.argv.slice(2);
const modulesIdx = argv.indexOf('--modules');
if (modulesIdx < 0 || argv.length !== 3) {
  console.error('usage: check_consistency.js --modules DIR DEPLOY_DIR');
  process.exit(2);
}
const req = createRequire(path.join(path.resolve(argv[modulesIdx + 1]), 'node_modules', 'noop.js'));
const YAML = req('yaml');
const TOML = req('smol-toml');
const deploy = argv.filter((_, i) => i !== modulesIdx && i !== modulesIdx + 1)[0];

const failures = [];
let checks = 0;
function check(ok, message) {
  checks++;
  if (!ok) failures.push(message);
}
const read = (p) => fs.readFileSync(path.join(deploy, p), 'utf8');
const yamlDocs = (p) => YAML.parseAllDocuments(read(p), { version: '1.1' }).map((d) => d.toJS()).filter(Boolean);
const portOf = (hostPort) => Number(String(hostPort).match(/:(\d+)$/)[1]);

const example = TOML.parse(read('config/aggregator.toml'));
const k8s = fs.readdirSync(path.join(deploy, 'kubernetes')).filter((f) => f.endsWith('.yaml'))
  .flatMap((f) => yamlDocs(path.join('kubernetes', f)));
const one = (kind) => {
  const found = k8s.filter((d) => d.kind === kind);
  if (found.length !== 1) throw new Error(`expected one ${kind} in kubernetes/, found ${found.length}`);
  return found[0];
};
const sts = one('StatefulSet');
const svc = one('Service');
const cm = one('ConfigMap');
const pdb = one('PodDisruptionBudget');
const pod = sts.spec.template;
const container = pod.spec.containers[0];
const volume = (name) => pod.spec.volumes.find((v) => v.name === name) || {};
const ports = Object.fromEntries(container.ports.map((p) => [p.name, p.containerPort]));

// The config file the pods read: where it is mounted, that it parses, that it only uses documented keys.
const configArg = container.args[container.args.indexOf('--config') + 1];
const configMount = container.volumeMounts.find((m) => m.mountPath === configArg);
check(configMount, `--config ${configArg} is not a volume mount`);
const configVolume = volume(configMount && configMount.name);
check(configVolume.configMap && configVolume.configMap.name === cm.metadata.name,
  `${configArg} is not mounted from ConfigMap ${cm.metadata.name}`);
const config = TOML.parse(cm.data[configMount.subPath]);
for (const key of Object.keys(config)) {
  check(key in example, `ConfigMap key ${key} is not in deploy/config/aggregator.toml (the documented keys)`);
}

// Ports: config <-> container <-> Service <-> probes and scrape annotations.
check(config.listen.every((l) => portOf(l) === ports.data),
  `listen ${config.listen} vs containerPort data ${ports.data}`);
check(portOf(config['metrics-listen']) === ports.metrics,
  `metrics-listen ${config['metrics-listen']} vs containerPort metrics ${ports.metrics}`);
for (const p of svc.spec.ports) {
  check(ports[p.targetPort] === p.port, `Service port ${p.name}: ${p.port} -> ${p.targetPort} is not a container port`);
}
check(container.livenessProbe.httpGet.port === 'metrics' && container.livenessProbe.httpGet.path === '/healthz',
  'livenessProbe is not /healthz on the metrics port');
check(container.readinessProbe.httpGet.port === 'metrics' && container.readinessProbe.httpGet.path === '/readyz',
  'readinessProbe is not /readyz on the metrics port');
check(Number(pod.metadata.annotations['prometheus.io/port']) === ports.metrics,
  'prometheus.io/port is not the metrics port');

// Secrets and identity.
const secretMount = container.volumeMounts.find((m) => volume(m.name).secret);
check(secretMount && secretMount.mountPath === config['job-secrets-dir'],
  `job-secrets-dir ${config['job-secrets-dir']} is not where the Secret is mounted`);
check(container.env.some((e) => e.name === 'SPARSEREDUCE_NAME' && e.valueFrom.fieldRef.fieldPath === 'metadata.name'),
  'SPARSEREDUCE_NAME does not come from the pod name');

// Service, StatefulSet and PDB select the same pods.
const labels = pod.metadata.labels;
const selects = (selector) => Object.entries(selector).every(([k, v]) => labels[k] === v);
check(sts.spec.serviceName === svc.metadata.name && svc.spec.clusterIP === 'None',
  'serviceName does not name the headless Service');
check(selects(sts.spec.selector.matchLabels), 'StatefulSet selector does not match its pods');
check(selects(svc.spec.selector), 'Service selector does not match the pods');
check(selects(pdb.spec.selector.matchLabels), 'PodDisruptionBudget selector does not match the pods');

// Memory: the daemon's budget must fit in the container, or the kernel OOM-kills it before it refuses work.
const quantity = (q) => {
  const m = String(q).match(/^(\d+)(Ki|Mi|Gi|Ti)?$/);
  return m ? Number(m[1]) * 1024 ** ['', 'Ki', 'Mi', 'Gi', 'Ti'].indexOf(m[2] || '') : NaN;
};
const memoryLimit = quantity(container.resources.limits.memory);
check(config['max-total-memory'] + config['buffer-pool-bytes'] < memoryLimit,
  `max-total-memory ${config['max-total-memory']} + buffer-pool-bytes ${config['buffer-pool-bytes']} ` +
  `does not fit in the memory limit ${container.resources.limits.memory}`);

// Stop deadlines: the drain, and then the 5 s an aborted job's workers get to read their Error (the session's close
// grace, docs/OPERATIONS.md), must end before Kubernetes or systemd kill the daemon.
const closeGraceMs = 5000;
check(pod.spec.terminationGracePeriodSeconds * 1000 > config['drain-timeout-ms'] + closeGraceMs,
  `terminationGracePeriodSeconds ${pod.spec.terminationGracePeriodSeconds} s <= ` +
  `drain-timeout-ms ${config['drain-timeout-ms']} + ${closeGraceMs} ms close grace`);
const unit = read('systemd/sparsereduce-aggregator.service');
const stop = unit.match(/^TimeoutStopSec=(\d+)(s|min)?$/m);
check(stop, 'TimeoutStopSec= missing or not in s/min');
const stopMs = stop ? Number(stop[1]) * (stop[2] === 'min' ? 60000 : 1000) : 0;
check(stopMs > example['drain-timeout-ms'] + closeGraceMs,
  `TimeoutStopSec ${stopMs} ms <= drain-timeout-ms ${example['drain-timeout-ms']} + ${closeGraceMs} ms close grace`);
const execConfig = (unit.match(/^ExecStart=.* --config (\S+)/m) || [])[1];
check(execConfig === '/etc/sparsereduce/aggregator.toml',
  `ExecStart reads ${execConfig}, the package installs /etc/sparsereduce/aggregator.toml`);

// The image: ports and the numeric user the pod runs as.
const dockerfile = read('docker/Dockerfile');
const exposed = (dockerfile.match(/^EXPOSE (.+)$/m) || ['', ''])[1].split(/\s+/).map(Number);
check(exposed.includes(ports.data) && exposed.includes(ports.metrics),
  `EXPOSE ${exposed} lacks the data/metrics ports`);
const user = (dockerfile.match(/^USER (\d+)(?::(\d+))?$/m) || []);
check(Number(user[1]) === pod.spec.securityContext.runAsUser, `Dockerfile USER ${user[1]} vs runAsUser`);

failures.forEach((f) => console.log(`INCONSISTENT ${f}`));
console.log(`${checks - failures.length} passed, ${failures.length} failed`);
process.exitCode = failures.length ? 1 : 0;
