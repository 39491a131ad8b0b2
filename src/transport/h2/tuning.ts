/**
 * Flow-control and framing sizes. Node's defaults (64 KiB windows, 16 KiB
 * frames) cap one stream at a fraction of what the socket carries; these
 * values let a single tunnel stream run at close to raw TLS speed.
 */

/**
 * SETTINGS_INITIAL_WINDOW_SIZE we advertise: receive window per stream. A
 * tunnel stream carries many connections, each with its own window of up to
 * 4 MiB; 1 MiB here cost ≈ 15% with 8 bulk flows. It is also what a peer may
 * have in flight towards us, which the tunnel sockets' send buffers are
 * sized to hold (see ../socket-send-buffer.ts).
 */
export const DEFAULT_STREAM_WINDOW_BYTES = 4 * 1024 * 1024;

/** Connection-level receive window (WINDOW_UPDATE on stream 0). */
export const DEFAULT_SESSION_WINDOW_BYTES = 16 * 1024 * 1024;

/**
 * SETTINGS_MAX_FRAME_SIZE we advertise: the largest DATA frame we accept.
 * Larger frames let a 32 KiB message arrive in one piece, so it is handed on
 * without being reassembled. (2^24-1 is the protocol maximum.)
 */
export const MAX_FRAME_BYTES = 64 * 1024;
