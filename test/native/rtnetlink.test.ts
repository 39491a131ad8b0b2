// Pure tests of the rtnetlink byte layout and input validation: no sockets,
// no root, no kernel.

import test from 'ava';
import { endianness } from 'node:os';
import {
  RTM_NEWADDR,
  addressBytes,
  buildGetLinkByName,
  buildNewAddr,
  buildNewLink,
  buildSetLinkAlias,
  buildSetLinkUp,
  encodeIfinfomsg,
  formatAddress,
  parseAddr,
  parseLink,
} from '../../native/rtnetlink.js';
import {
  NLMSG_ERROR,
  NLM_F_ACK_TLVS,
  NLM_F_CAPPED,
  encodeAttr,
  encodeNestedAttr,
  encodeStringAttr,
  encodeMessage,
  parseErrorPayload,
  parseMessages,
  readU32,
} from '../../native/netlink-message.js';
import { HostInterfaceSpecError, KANAL_LINK_ALIAS, validateHostInterfaceSpec } from '../../native/host-interface.js';
import { NetlinkError } from '../../native/netlink-error.js';

const LE = endianness() === 'LE';
const hex = (s: string): Buffer => Buffer.from(s.replace(/\s+/g, ''), 'hex');

test('RTM_NEWADDR IPv4 /32 scope host encodes byte for byte', (t) => {
  if (!LE) return t.pass('expected bytes are written for little-endian hosts');
  const msg = buildNewAddr(0x01020304, 7, '192.0.2.10');
  t.deepEqual(
    msg,
    hex(`
      28000000 1400 0506 04030201 00000000
      02 20 00 fe 07000000
      0800 0200 c000020a
      0800 0100 c000020a`),
  );
});

test('RTM_NEWADDR IPv6 /128 carries IFA_F_NODAD and 16-byte addresses', (t) => {
  if (!LE) return t.pass('expected bytes are written for little-endian hosts');
  const msg = buildNewAddr(1, 3, '2001:db8::10');
  const addr = '20010db8000000000000000000000010';
  t.deepEqual(
    msg,
    hex(`
      40000000 1400 0506 01000000 00000000
      0a 80 02 fe 03000000
      1400 0200 ${addr}
      1400 0100 ${addr}`),
  );
});

test('RTM_NEWLINK nests IFLA_INFO_KIND inside IFLA_LINKINFO with 4-byte padding', (t) => {
  if (!LE) return t.pass('expected bytes are written for little-endian hosts');
  const msg = buildNewLink(2, 'kanal0', 'bridge');
  t.deepEqual(
    msg,
    hex(`
      3c000000 1000 0506 02000000 00000000
      00 00 0000 00000000 00000000 00000000
      0b00 0300 6b616e616c30 00 00
      1000 1200 0b00 0100 627269646765 00 00`),
  );
  t.is(msg.length % 4, 0);
});

test('set-alias: RTM_NEWLINK on the ifindex with IFLA_IFALIAS (20), no NUL, padded to 4', (t) => {
  if (!LE) return t.pass('expected bytes are written for little-endian hosts');
  const msg = buildSetLinkAlias(3, 7, 'kanal');
  t.deepEqual(
    msg,
    hex(`
      2c000000 1000 0500 03000000 00000000
      00 00 0000 07000000 00000000 00000000
      0900 1400 6b616e616c 000000`),
  );
  t.is(msg.length % 4, 0);
});

test('set-alias with the Kanal ownership marker encodes byte for byte', (t) => {
  if (!LE) return t.pass('expected bytes are written for little-endian hosts');
  t.is(KANAL_LINK_ALIAS, 'kanal-agent: created by kanal, removed on clean stop');
  const msg = buildSetLinkAlias(0x0a0b0c0d, 12, KANAL_LINK_ALIAS);
  // 52 alias bytes: rta_len 56 (0x38), already 4-aligned; nlmsg_len 16 + 16 + 56 = 88 (0x58).
  t.deepEqual(
    msg,
    hex(`
      58000000 1000 0500 0d0c0b0a 00000000
      00 00 0000 0c000000 00000000 00000000
      3800 1400
      6b616e616c2d6167656e743a20 63726561746564206279206b616e616c2c20
      72656d6f766564206f6e20636c65616e2073746f70`),
  );
});

test('set-alias refuses an empty, overlong or NUL-containing alias', (t) => {
  t.throws(() => buildSetLinkAlias(1, 2, ''), { message: /1\.\.255 bytes/ });
  t.throws(() => buildSetLinkAlias(1, 2, 'a'.repeat(256)), { message: /1\.\.255 bytes/ });
  t.throws(() => buildSetLinkAlias(1, 2, 'a\0b'), { message: /without NUL/ });
  t.is(buildSetLinkAlias(1, 2, 'a'.repeat(255)).length, 16 + 16 + 260);
});

test('parseLink reads IFLA_IFALIAS as the kernel sends it (NUL-terminated) and omits it when absent', (t) => {
  const reply = (attrs: Buffer[]): Buffer => encodeMessage(16, 0, 1, Buffer.concat([encodeIfinfomsg(5, 1), ...attrs]));
  const name = encodeStringAttr(3, 'kanal0');
  const kind = encodeNestedAttr(18, [encodeStringAttr(1, 'bridge')]);
  const [withAlias] = parseMessages(reply([name, encodeStringAttr(20, KANAL_LINK_ALIAS), kind]));
  t.deepEqual(parseLink(withAlias), { ifindex: 5, flags: 1, name: 'kanal0', alias: KANAL_LINK_ALIAS, kind: 'bridge' });
  const [without] = parseMessages(reply([name, kind]));
  t.deepEqual(parseLink(without), { ifindex: 5, flags: 1, name: 'kanal0', kind: 'bridge' });
  // What we send (no NUL) reads back the same.
  const [sent] = parseMessages(buildSetLinkAlias(1, 5, KANAL_LINK_ALIAS));
  t.is(parseLink(sent).alias, KANAL_LINK_ALIAS);
});

test('set-up sets IFF_UP in both ifi_flags and ifi_change', (t) => {
  const [m] = parseMessages(buildSetLinkUp(9, 42));
  t.truthy(m);
  const link = parseLink(m);
  t.is(link.ifindex, 42);
  t.is(link.flags, 1);
  t.is(readU32(m.payload, 12), 1); // ifi_change
});

test('GETLINK by name round-trips through the parser', (t) => {
  const msgs = parseMessages(buildGetLinkByName(5, 'eth0'));
  t.is(msgs.length, 1);
  t.is(msgs[0].seq, 5);
  t.is(parseLink(msgs[0]).name, 'eth0');
});

test('parseAddr reads back what buildNewAddr wrote', (t) => {
  const [m] = parseMessages(buildNewAddr(1, 12, '2001:db8::1'));
  const a = parseAddr(m);
  t.is(a.prefixlen, 128);
  t.is(a.scope, 254);
  t.is(a.ifindex, 12);
  t.is(a.local, '2001:db8::1');
  t.is(a.address, '2001:db8::1');
});

test('NLMSG_ERROR with extack message is decoded', (t) => {
  // error -95, capped original header, then NLMSGERR_ATTR_MSG "Unknown device type"
  const err = Buffer.alloc(4);
  err.writeInt32LE(-95, 0);
  if (!LE) err.writeInt32BE(-95, 0);
  const orig = encodeMessage(16, 0, 1, Buffer.alloc(0));
  const tlv = encodeAttr(1, Buffer.from('Unknown device type\0'));
  const datagram = encodeMessage(NLMSG_ERROR, NLM_F_CAPPED | NLM_F_ACK_TLVS, 1, Buffer.concat([err, orig, tlv]));
  const [m] = parseMessages(datagram);
  t.deepEqual(parseErrorPayload(m), { errno: 95, extackMessage: 'Unknown device type' });
});

test('parseMessages splits a multi-message datagram and rejects a truncated one', (t) => {
  const a = encodeMessage(RTM_NEWADDR, 2, 1, Buffer.alloc(8));
  const b = encodeMessage(3, 2, 1, Buffer.alloc(4));
  t.is(parseMessages(Buffer.concat([a, b])).length, 2);
  t.throws(() => parseMessages(Buffer.concat([a, b]).subarray(0, a.length + 18)));
});

test('address parsing and formatting round-trip', (t) => {
  for (const [input, canonical] of [
    ['10.0.0.1', '10.0.0.1'],
    ['2001:db8::1', '2001:db8::1'],
    ['2001:DB8:0:0:0:0:0:1', '2001:db8::1'],
    ['::1', '::1'],
    ['fe80::', 'fe80::'],
    ['::ffff:192.0.2.1', '::ffff:c000:201'],
    ['1:2:3:4:5:6:7:8', '1:2:3:4:5:6:7:8'],
    ['1:0:0:2::3', '1:0:0:2::3'],
    ['1:0:0:2:0:0:3:4', '1::2:0:0:3:4'], // ties: first run wins, as inet_ntop
  ] as const) {
    const { family, bytes } = addressBytes(input);
    t.is(formatAddress(family, bytes), canonical, input);
  }
  t.throws(() => addressBytes('10.0.0.1/32'));
  t.throws(() => addressBytes('fe80::1%eth0'));
});

test('validation rejects bad names, kinds and addresses with clear errors', (t) => {
  const ok = { name: 'kanal0', kind: 'bridge', address: '10.96.0.1' } as const;
  t.deepEqual(validateHostInterfaceSpec(ok), ok);
  const cases: Array<[Record<string, unknown>, HostInterfaceSpecError['field'], RegExp]> = [
    [{ name: 'averyveryverylongname' }, 'name', /at most 15/],
    [{ name: '' }, 'name', /non-empty/],
    [{ name: 'a/b' }, 'name', /contains "\/"/],
    [{ name: 'a b' }, 'name', /contains " "/],
    [{ name: 'kanal%d' }, 'name', /contains "%"/],
    [{ name: 'eth0:1' }, 'name', /contains ":"/],
    [{ kind: 'veth' }, 'kind', /not supported/],
    [{ address: '10.96.0.1/32' }, 'address', /not an IPv4 or IPv6 literal/],
    [{ address: 'kubernetes' }, 'address', /not an IPv4 or IPv6 literal/],
    [{ address: 'fe80::1%eth0' }, 'address', /no zone/],
    [{ address: '0.0.0.0' }, 'address', /unspecified/],
    [{ address: '::' }, 'address', /unspecified/],
    [{ address: '224.0.0.1' }, 'address', /multicast/],
  ];
  for (const [patch, field, re] of cases) {
    const err = t.throws(() => validateHostInterfaceSpec({ ...ok, ...patch }), { instanceOf: HostInterfaceSpecError });
    t.is(err?.field, field);
    t.regex(err?.message ?? '', re);
  }
});

test('NetlinkError exposes errno, symbolic code and operation', (t) => {
  const e = new NetlinkError('RTM_NEWLINK x kind dummy', 95, 'boom');
  t.is(e.errno, 95);
  t.is(e.code, 'EOPNOTSUPP');
  t.is(e.operation, 'RTM_NEWLINK x kind dummy');
  t.true(e instanceof Error);
});
