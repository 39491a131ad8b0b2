/**
 * TLS channel credentials for grpc-js that send no SNI for an IP literal.
 * grpc-js's own (credentials.createSsl) set the TLS ServerName to the target
 * host whatever it is; for 127.0.0.1 that breaks RFC 6066 §3 and Node warns
 * (DEP0123). Otherwise the same: verify against `ca`, present the client
 * pair, ALPN h2, and check the certificate against serverName, else the
 * target's host — as the h2 transport's channel does.
 */
import net from 'node:net';
import tls from 'node:tls';
import * as grpc from '@grpc/grpc-js';
import { clientAlpn, type ClientTlsOptions } from '../transport.js';

export class ClientTlsCredentials extends grpc.ChannelCredentials {
  private readonly context: tls.SecureContext;

  constructor(private readonly opts: ClientTlsOptions) {
    super();
    this.context = tls.createSecureContext({ ca: opts.ca, cert: opts.cert, key: opts.key });
  }

  _isSecure(): boolean {
    return true;
  }

  _equals(other: grpc.ChannelCredentials): boolean {
    return other === this;
  }

  _createSecureConnector(
    target: grpc.experimental.GrpcUri,
    _options: grpc.ChannelOptions,
    callCredentials?: grpc.CallCredentials,
  ): grpc.experimental.SecureConnector {
    const name = this.opts.serverName ?? grpc.experimental.splitHostPort(target.path)?.host ?? target.path;
    const call = callCredentials ?? grpc.CallCredentials.createEmpty();
    return {
      connect: (socket) =>
        new Promise((resolve, reject) => {
          const secure = tls.connect(
            {
              socket,
              secureContext: this.context,
              ALPNProtocols: clientAlpn(this.opts),
              ...(net.isIP(name) === 0 ? { servername: name } : {}),
              checkServerIdentity: (_host, cert) => tls.checkServerIdentity(name, cert),
            },
            () => resolve({ socket: secure, secure: true }),
          );
          secure.once('error', reject);
        }),
      waitForReady: () => Promise.resolve(),
      getCallCredentials: () => call,
      destroy: () => undefined,
    };
  }
}
