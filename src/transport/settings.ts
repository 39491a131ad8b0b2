/** `--transport`, the same on server and agent. */
import { choice } from '../settings/kinds.js';
import { TRANSPORT_NAMES } from './choice.js';

export const transportSettings = {
  transport: choice({ choices: TRANSPORT_NAMES, default: TRANSPORT_NAMES[0], describe: 'gRPC implementation', group: 'Tunnel' }),
} as const;
