/**
 * What a start loads. prom-client's metric classes and default metrics come
 * each from its own module (src/domain/prom-client.ts, default-metrics.ts),
 * never through its index, which also loads the Pushgateway, the cluster
 * aggregator and @opentelemetry/api (51 files) for exemplars Kanal never
 * records. node:http is taken as CommonJS exports (src/common/node-http.ts):
 * its ES module facade would load Node's bundled undici. Checked at run time, in a fresh process that loads both commands'
 * modules and builds a server's and an agent's metrics, because these are
 * CommonJS files prom-client requires, not imports of Kanal's.
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import test from 'ava';
import { run } from '../../kit/launch/run-to-end.js';

const DIST = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

/** Loads the command modules, makes both components' metrics and one exposition, then prints the CommonJS files loaded. */
const PROBE = `
import { createRequire } from 'node:module';
await import(${JSON.stringify(path.join(DIST, 'src/cli/server-command.js'))});
await import(${JSON.stringify(path.join(DIST, 'src/cli/agent-command.js'))});
const { KanalMetrics } = await import(${JSON.stringify(path.join(DIST, 'src/domain/metrics.js'))});
for (const component of ['server', 'agent']) await new KanalMetrics(component).registry.metrics();
process.stdout.write(JSON.stringify({ files: Object.keys(createRequire(import.meta.url).cache), builtins: process.moduleLoadList }));
`;

interface Loaded {
  /** The CommonJS files loaded (require.cache). */
  files: string[];
  /** Node's own modules loaded, as process.moduleLoadList names them ("NativeModule internal/deps/undici/undici"). */
  builtins: string[];
}

async function loaded(): Promise<Loaded> {
  const r = await run(process.execPath, ['--input-type=module', '-e', PROBE], { timeoutMs: 60_000 });
  if (r.code !== 0) throw new Error(`the probe failed (exit ${r.code ?? r.signal}): ${r.stderr}`);
  return JSON.parse(r.stdout) as Loaded;
}

test("a start loads neither prom-client's index nor @opentelemetry/api", async (t) => {
  const { files } = await loaded();
  t.true(
    files.some((f) => f.includes(`${path.sep}prom-client${path.sep}lib${path.sep}counter.js`)),
    'the probe sees the CommonJS files prom-client loads',
  );
  const unwanted = files.filter((f) =>
    /[/\\]prom-client[/\\]index\.js$|[/\\]@opentelemetry[/\\]|[/\\]prom-client[/\\]lib[/\\](pushgateway|cluster)\.js$/.test(f),
  );
  t.deepEqual(
    unwanted,
    [],
    "import prom-client's classes from src/domain/prom-client.ts, its default metrics from src/domain/default-metrics.ts",
  );
});

test("a start does not load Node's bundled undici", async (t) => {
  const { builtins } = await loaded();
  t.true(builtins.includes('NativeModule http'), 'the probe sees the built-in modules loaded');
  t.deepEqual(
    builtins.filter((m) => m.includes('undici')),
    [],
    'take node:http from src/common/node-http.ts: importing it as an ES module reads its WebSocket getter, which loads undici',
  );
});
