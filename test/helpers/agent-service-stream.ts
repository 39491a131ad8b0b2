/**
 * An AgentService/Connect stream written directly on @grpc/grpc-js
 * (e2e-grpc-client.ts), for tests that act as a misbehaving or silent agent:
 * mTLS to the server's agent port with the credential the test chooses,
 * the metadata it chooses, cancelled by the scope.
 */
import fs from 'node:fs';
import * as grpc from '@grpc/grpc-js';
import type { Scope } from '../../kit/launch/cleanup-scope.js';
import type { AgentCredential } from '../../kit/pki/throwaway-pki.js';
import { ProxyStream } from './e2e-grpc-client.js';
import type { Workspace } from './workspace.js';

export interface AgentServiceStreamSpec {
  ws: Workspace;
  server: { agentPort: number };
  credential: AgentCredential;
  /** E.g. { agentid: 'node-1' }; none at all by default. */
  metadata?: Record<string, string>;
  /** Added to the TLS name override the throwaway certificates need. */
  channelOptions?: grpc.ChannelOptions;
}

export function agentServiceStream(scope: Scope, spec: AgentServiceStreamSpec): ProxyStream {
  const { ws, credential } = spec;
  const stream = new ProxyStream(`127.0.0.1:${spec.server.agentPort}`, {
    credentials: grpc.credentials.createSsl(
      fs.readFileSync(ws.pki.caCert),
      fs.readFileSync(credential.key),
      fs.readFileSync(credential.cert),
    ),
    path: '/AgentService/Connect',
    ...(spec.metadata ? { metadata: spec.metadata } : {}),
    channelOptions: { 'grpc.ssl_target_name_override': 'localhost', 'grpc.default_authority': 'localhost', ...spec.channelOptions },
  });
  scope.teardown(() => stream.cancel());
  return stream;
}
