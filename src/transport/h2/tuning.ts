/**
 * Flow-control and framing sizes. Node's defaults (64 KiB windows, 16 KiB
 * frames) cap one stream at a fraction of what the socket carries; these
 * values let a single tunnel stream run at close to raw TLS speed.
 */

/**
 * SETTINGS_INITIAL_WINDOW_SIZE we advertise: receive window per stream. It
 * bounds what one tunnel has in flight per direction at the HTTP/2 level,
 * and must stay small: Node's HTTP/2 stops reading its socket while one of
 * its writes is pending (a CVE-2019-9511/9517 mitigation), so two Node peers
 * sending bulk data both ways can each wait for the other to read once both
 * directions hold more than the kernel's socket buffers, and the tunnel
 * stalls until keepalive closes it. At 4 MiB that happened in about one run
 * of ten of the 64 MiB echo test under load; 1 MiB costs ≈ 15% with 8 bulk
 * flows and none with one (the per-connection windows above it still grow).
 */
export const DEFAULT_STREAM_WINDOW_BYTES = 1024 * 1024;

/** Connection-level receive window (WINDOW_UPDATE on stream 0). */
export const DEFAULT_SESSION_WINDOW_BYTES = 16 * 1024 * 1024;

/**
 * SETTINGS_MAX_FRAME_SIZE we advertise: the largest DATA frame we accept.
 * Larger frames let a 32 KiB message arrive in one piece, so it is handed on
 * without being reassembled. (2^24-1 is the protocol maximum.)
 */
export const MAX_FRAME_BYTES = 64 * 1024;
