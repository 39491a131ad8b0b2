/**
 * The largest flow-control window the protocol allows (docs/protocol.md,
 * "Flow control"): a receiver never lets its sender have more than this
 * outstanding, so credit that would, or a resume entry whose limit lies
 * further beyond what was received, is a fault of that connection. Kanal's
 * --max-connection-window stops here.
 */
export const MAX_WINDOW_BYTES = 64 * 1024 * 1024;
