/**
 * Who a frontend client is: its address, and for the audit log the subject
 * of its client certificate (mTLS TCP) or the process on the other end of a
 * Unix socket (SO_PEERCRED: normally the kube-apiserver). Read once per
 * accepted connection; the identity only when `identify` (an audit log is
 * written): parsing the certificate, or a call through libc (some 20 µs), a dial.
 */
import net from 'node:net';
import tls from 'node:tls';
import { peerCredentials } from '../../../native/peer-credentials.js';
import { socketFd } from '../../../native/socket-buffers.js';
import type { ClientIdentity } from '../../tunnel/connection.js';
import { oneLine } from '../identity/agent-credential.js';

export function frontendClient(socket: net.Socket, peer: string, identify: boolean): ClientIdentity {
  if (!identify) return { address: peer };
  if (socket instanceof tls.TLSSocket) {
    const cert = socket.getPeerX509Certificate();
    return cert ? { address: peer, subject: oneLine(cert.subject) } : { address: peer };
  }
  if (peer.startsWith('unix:')) {
    const cred = peerCredentials(socketFd(socket));
    if (cred) return { address: peer, uid: cred.uid, pid: cred.pid };
  }
  return { address: peer };
}
