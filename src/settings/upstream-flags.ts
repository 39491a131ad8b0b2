/**
 * Upstream Konnectivity v0.36's flags that Kanal accepts without giving
 * them its own meaning: klog's logging flags, mapped onto
 * Kanal's JSON logs where they can be, and flags that mean nothing in Kanal,
 * accepted so upstream's manifests run unchanged and named once in the log.
 * docs/upstream-flags.md lists every upstream flag and what Kanal does with it.
 */
import { UsageError } from '../common/usage-error.js';
import type { GivenType, Setting } from './setting.js';

const GROUP = 'Upstream flags Kanal ignores';

/** An upstream flag accepted, hidden from --help, and named once in the log when given (`notice`: why Kanal does nothing with it). */
function ignored(type: GivenType, notice: string): Setting<unknown, undefined> {
  return { type, describe: `Upstream flag, accepted and ignored: ${notice}`, group: GROUP, hidden: true, notice, parse: () => undefined };
}

/** klog's verbosity: 0-3 info, 4 debug, 5 and more trace (mapped onto --log-level by logLevelFrom). */
const verbosity: Setting<number | undefined, number | undefined> = {
  type: 'number',
  describe: 'klog verbosity, used when --log-level is not given: 0-3 info, 4 debug, 5 and more trace',
  group: 'Logging',
  parse: (v: number | undefined, flag) => {
    if (v !== undefined && (!Number.isInteger(v) || v < 0))
      throw new UsageError(`--${flag} must be a whole number of at least 0, got ${Number.isNaN(v) ? 'a value that is not a number' : v}`);
    return v;
  },
};

const KLOG_OUTPUT = 'Kanal writes its log to stdout, JSON or text (--logging-format); klog output flags have no meaning';

/** klog's flags, as upstream's binaries define them; `-v`/`--v` is mapped, the rest is output shaping Kanal's logs do not have. */
export const klogFlags = {
  v: verbosity,
  vmodule: ignored('string', 'per-file verbosity has no equivalent; use --log-level or --v'),
  logtostderr: ignored('boolean', KLOG_OUTPUT),
  alsologtostderr: ignored('boolean', KLOG_OUTPUT),
  alsologtostderrthreshold: ignored('string', KLOG_OUTPUT),
  stderrthreshold: ignored('string', KLOG_OUTPUT),
  'legacy-stderr-threshold-behavior': ignored('boolean', KLOG_OUTPUT),
  'log-file': ignored('string', KLOG_OUTPUT),
  'log-dir': ignored('string', KLOG_OUTPUT),
  'log-file-max-size': ignored('number', KLOG_OUTPUT),
  'one-output': ignored('boolean', KLOG_OUTPUT),
  'skip-headers': ignored('boolean', KLOG_OUTPUT),
  'skip-log-headers': ignored('boolean', KLOG_OUTPUT),
  'add-dir-header': ignored('boolean', KLOG_OUTPUT),
  'log-backtrace-at': ignored('string', 'Kanal logs no Go stack traces'),
} as const;

const CHANNELS = 'Kanal has no transfer channels: each connection has a flow-control window (--max-connection-window) and bounded queues';
const CONTENTION = 'Go block profiles have no Node.js equivalent; --enable-profiling offers CPU profiles and heap snapshots';

/** Server flags of upstream that mean nothing in Kanal. */
export const serverIgnoredFlags = {
  'xfr-channel-size': ignored('number', CHANNELS),
  'enable-contention-profiling': ignored('boolean', CONTENTION),
  'frontend-keepalive-time': ignored(
    'string',
    "Kanal does not PING the kube-apiserver's connections; a frontend that goes away is noticed by its socket",
  ),
  'graceful-shutdown-timeout': ignored(
    'string',
    "on SIGTERM the Kanal server closes its listeners and connections at once (upstream's default, 0); agents move to the other servers",
  ),
} as const;

/** Agent flags of upstream that mean nothing in Kanal. */
export const agentIgnoredFlags = {
  'xfr-channel-size': ignored('number', CHANNELS),
  'warn-on-channel-limit': ignored('boolean', CHANNELS),
  'enable-contention-profiling': ignored('boolean', CONTENTION),
  'probe-interval': ignored('string', "Kanal's /readyz follows its tunnels as they go up and down; there is nothing to poll"),
} as const;
