/** Which admin bind addresses serve /status (src/common/loopback.ts). */
import test from 'ava';
import { isLoopbackHost } from '../../src/common/loopback.js';

test('loopback: 127.0.0.0/8, ::1 (bracketed too), ::ffff:127.x and localhost', (t) => {
  for (const host of ['127.0.0.1', '127.1.2.3', '::1', '[::1]', '::ffff:127.0.0.1', 'localhost', 'LOCALHOST'])
    t.true(isLoopbackHost(host), host);
});

test('not loopback: wildcards, other addresses, other names', (t) => {
  for (const host of ['0.0.0.0', '::', '10.0.0.1', '128.0.0.1', '::2', '::ffff:10.0.0.1', 'node-1.example', '', 'localhost.evil']) {
    t.false(isLoopbackHost(host), host);
  }
});
