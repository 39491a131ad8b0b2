/**
 * Who a frontend client is, for the audit log: the subject of its client
 * certificate (mTLS TCP), or the process on the other end of a Unix socket
 * (SO_PEERCRED: normally the kube-apiserver). Read once per accepted connection.
 */
import net from 'node:net';
import tls from 'node:tls';
import { peerCredentials } from '../../../native/peer-credentials.js';
import { socketFd } from '../../../native/socket-buffers.js';
import type { ClientIdentity } from '../../tunnel/connection.js';
import { oneLine } from '../identity/agent-credential.js';

export function frontendClient(socket: net.Socket, peer: string): ClientIdentity {
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
