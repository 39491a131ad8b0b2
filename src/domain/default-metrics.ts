/**
 * prom-client's default metrics (process_*, nodejs_*) as its
 * `collectDefaultMetrics` registers them (prom-client's lib/defaultMetrics.js),
 * each from its own module, with the process CPU counters written here: its
 * own module loads @opentelemetry/api, 51 files, for exemplars Kanal never
 * records (src/domain/prom-client.ts).
 */
import type { DefaultMetricsCollectorConfiguration } from 'prom-client';
import eventLoopLag from 'prom-client/lib/metrics/eventLoopLag.js';
import gc from 'prom-client/lib/metrics/gc.js';
import heapSizeAndUsed from 'prom-client/lib/metrics/heapSizeAndUsed.js';
import heapSpacesSizeAndUsed from 'prom-client/lib/metrics/heapSpacesSizeAndUsed.js';
import osMemoryHeap from 'prom-client/lib/metrics/osMemoryHeap.js';
import processHandles from 'prom-client/lib/metrics/processHandles.js';
import processMaxFileDescriptors from 'prom-client/lib/metrics/processMaxFileDescriptors.js';
import processOpenFileDescriptors from 'prom-client/lib/metrics/processOpenFileDescriptors.js';
import processRequests from 'prom-client/lib/metrics/processRequests.js';
import processResources from 'prom-client/lib/metrics/processResources.js';
import processStartTime from 'prom-client/lib/metrics/processStartTime.js';
import version from 'prom-client/lib/metrics/version.js';
import { Counter, type Registry } from './prom-client.js';

type Config = DefaultMetricsCollectorConfiguration<'text/plain; version=0.0.4; charset=utf-8'>;

/**
 * process_cpu_{user,system,}seconds_total as prom-client's
 * lib/metrics/processCpuTotal.js counts them (no prefix, labels or exemplars:
 * Kanal sets none): the CPU used since the last scrape is added at each one.
 */
function processCpuTotal(registry: Registry): void {
  let last = process.cpuUsage();
  const registers = [registry];
  const user = new Counter({
    name: 'process_cpu_user_seconds_total',
    help: 'Total user CPU time spent in seconds.',
    registers,
    // This one metric's collect sets all three, as prom-client's does.
    collect() {
      const now = process.cpuUsage();
      const userMicros = now.user - last.user;
      const systemMicros = now.system - last.system;
      last = now;
      user.inc(userMicros / 1e6);
      system.inc(systemMicros / 1e6);
      total.inc((userMicros + systemMicros) / 1e6);
    },
  });
  const system = new Counter({ name: 'process_cpu_system_seconds_total', help: 'Total system CPU time spent in seconds.', registers });
  const total = new Counter({ name: 'process_cpu_seconds_total', help: 'Total user and system CPU time spent in seconds.', registers });
}

/** In prom-client's order, so an exposition lists them as before. */
const OTHERS = [
  processStartTime,
  osMemoryHeap,
  processOpenFileDescriptors,
  processMaxFileDescriptors,
  eventLoopLag,
  processResources,
  processHandles,
  processRequests,
  heapSizeAndUsed,
  heapSpacesSizeAndUsed,
  version,
  gc,
];

/** Registers the default metrics on `registry`, as `collectDefaultMetrics({ register: registry, ...config })` does. */
export function collectDefaultMetrics(registry: Registry, config: Omit<Config, 'register' | 'prefix' | 'labels'> = {}): void {
  const full: Config = { eventLoopMonitoringPrecision: 10, ...config, register: registry };
  processCpuTotal(registry);
  for (const register of OTHERS) register(registry, full);
}
