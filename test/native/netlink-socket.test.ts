// Socket-level behaviour that needs no privilege and changes nothing: only
// read-only RTM_GETLINK requests, so it is safe in the root namespace.

import test from 'ava';
import { NetlinkSocket, withNetlinkSocket } from '../../native/netlink-socket.js';
import { NetlinkError } from '../../native/netlink-error.js';
import { IFLA_IFNAME, RTM_GETLINK, RTM_NEWLINK, buildGetLinkByName, encodeIfinfomsg, parseLink } from '../../native/rtnetlink.js';
import { NLM_F_REQUEST, encodeMessage, encodeStringAttr } from '../../native/netlink-message.js';

const linux = process.platform === 'linux';
const linuxTest = linux ? test : test.skip;

linuxTest('GETLINK lo answers with ifindex 1', (t) => {
  const replies = withNetlinkSocket((s) => s.request('RTM_GETLINK lo', (seq) => buildGetLinkByName(seq, 'lo')));
  const link = parseLink(replies.find((m) => m.type === RTM_NEWLINK)!);
  t.is(link.ifindex, 1);
  t.is(link.name, 'lo');
});

linuxTest('a missing link is a NetlinkError with errno ENODEV', (t) => {
  const err = t.throws(
    () => withNetlinkSocket((s) => s.request('RTM_GETLINK nosuchlink0', (seq) => buildGetLinkByName(seq, 'nosuchlink0'))),
    { instanceOf: NetlinkError },
  );
  t.is(err?.errno, 19);
  t.is(err?.code, 'ENODEV');
  t.is(err?.operation, 'RTM_GETLINK nosuchlink0');
});

linuxTest('a reply that never completes times out instead of hanging', (t) => {
  // Without NLM_F_ACK the kernel sends the link but no terminator: the socket
  // must give up after its timeout.
  const sock = NetlinkSocket.open({ timeoutMs: 300 });
  t.teardown(() => sock.close());
  const started = Date.now();
  const err = t.throws(
    () =>
      sock.request('RTM_GETLINK lo (no ack)', (seq) =>
        encodeMessage(RTM_GETLINK, NLM_F_REQUEST, seq, Buffer.concat([encodeIfinfomsg(0), encodeStringAttr(IFLA_IFNAME, 'lo')])),
      ),
    { instanceOf: NetlinkError },
  );
  const elapsed = Date.now() - started;
  t.regex(err?.message ?? '', /within 300 ms/);
  t.true(elapsed >= 250, `elapsed ${elapsed} ms: not before its timeout`);

  // The socket stays usable, and the late/stale replies do not confuse the next request.
  const replies = sock.request('RTM_GETLINK lo', (seq) => buildGetLinkByName(seq, 'lo'));
  t.is(parseLink(replies.find((m) => m.type === RTM_NEWLINK)!).ifindex, 1);
});

linuxTest('a closed socket refuses requests', (t) => {
  const sock = NetlinkSocket.open();
  sock.close();
  sock.close(); // idempotent
  t.throws(() => sock.request('x', (seq) => buildGetLinkByName(seq, 'lo')), { instanceOf: NetlinkError, message: /closed/ });
});
