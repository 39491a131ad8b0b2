/**
 * The default of --resume-timeout on server and agent (docs/protocol.md,
 * "Resume"): long enough for a blip the agent notices by PING (a few
 * seconds) plus its reconnect back-off and a load balancer's reshuffle,
 * short enough that the connections of a node that is gone end within half
 * a minute. Measured figures: bench/RESULTS.md, section 8.
 */
export const DEFAULT_RESUME_TIMEOUT_MS = 30_000;
