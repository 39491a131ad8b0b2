/**
 * Who a frontend client is, for the audit log: the subject of its client
 * certificate (mTLS TCP), or the process on the other end of a Unix socket
 * (SO_PEERCRED: normally the kube-apiserver). Read once per accepted
 * connection; the Unix peer's credentials only when `peerCredentials` (an
 * audit log is written): a call through libc costs some 20 µs a dial.
 */
import net from 'node:net';
import tls from 'node:tls';
import { peerCredentials as readPeerCredentials } from '../../../native/peer-credentials.js';
import { socketFd } from '../../../native/socket-buffers.js';
import type { ClientIdentity } from '../../tunnel/connection.js';
import { oneLine } from '../identity/agent-credential.js';

export function frontendClient(socket: net.Socket, peer: string, peerCredentials: boolean): ClientIdentity {
  if (socket instanceof tls.TLSSocket) {
    const cert = socket.getPeerX509Certificate();
    return cert ? { address: peer, subject: oneLine(cert.subject) } : { address: peer };
  }
  if (peerCredentials && peer.startsWith('unix:')) {
    const cred = readPeerCredentials(socketFd(socket));
    if (cred) return { address: peer, uid: cred.uid, pid: cred.pid };
  }
  return { address: peer };
}
