/**
 * The one escaping of peer-chosen text for a terminal (src/common/terminal-text.ts):
 * every control, bidi and invisible character it lists becomes \uXXXX,
 * printable text of any script is kept, and JSON escaped so parses back to
 * the same value.
 */
import test from 'ava';
import { escapeForTerminal, escapeStringsForTerminal, hasUnsafeForTerminal, jsonForTerminal } from '../../src/common/terminal-text.js';

/** Each character a terminal acts on or shows misleadingly, with its escape. */
const UNSAFE: readonly (readonly [string, string])[] = [
  ['\u0000', '\\u0000'],
  ['\u0007', '\\u0007'],
  ['\u001b', '\\u001b'],
  ['\n', '\\n'],
  ['\r', '\\r'],
  ['\t', '\\t'],
  ['\u007f', '\\u007f'],
  ['\u0080', '\\u0080'],
  ['\u009b', '\\u009b'],
  ['\u009d', '\\u009d'],
  ['\u009f', '\\u009f'],
  ['\u00ad', '\\u00ad'],
  ['\u061c', '\\u061c'],
  ['\u200b', '\\u200b'],
  ['\u200d', '\\u200d'],
  ['\u200e', '\\u200e'],
  ['\u200f', '\\u200f'],
  ['\u2028', '\\u2028'],
  ['\u2029', '\\u2029'],
  ['\u202a', '\\u202a'],
  ['\u202e', '\\u202e'],
  ['\u2060', '\\u2060'],
  ['\u2066', '\\u2066'],
  ['\u2069', '\\u2069'],
  ['\ufeff', '\\ufeff'],
  ['\u{e0041}', '\\udb40\\udc41'],
];

test('every control, bidi and invisible character is written as its escape, and nothing else is', (t) => {
  for (const [raw, escaped] of UNSAFE) {
    t.is(escapeForTerminal(`a${raw}b`), `a${escaped}b`, escaped);
    t.true(hasUnsafeForTerminal(raw), escaped);
  }
  // Every C0 and C1 control, and DEL, one by one.
  for (let c = 0; c <= 0x9f; c++) {
    if (c >= 0x20 && c < 0x7f) continue;
    t.not(escapeForTerminal(String.fromCharCode(c)), String.fromCharCode(c), `U+${c.toString(16)}`);
  }
  const printable = 'node-1.example, ünïcode, Ελληνικά, 日本語, עברית and emoji 🙂 ~!@#$%^&*()_+{}|:"<>?';
  t.is(escapeForTerminal(printable), printable);
  t.false(hasUnsafeForTerminal(printable));
});

test('the CSI, OSC, ESC and bidi sequences of an attack are inert after escaping', (t) => {
  const attack = 'x\u009b31m\u009d0;title\u0007\u001b[2J\u202eevil\u2066';
  t.is(escapeForTerminal(attack), 'x\\u009b31m\\u009d0;title\\u0007\\u001b[2J\\u202eevil\\u2066');
  t.is(
    escapeForTerminal('line one\nline two\u001b[2J', { keepNewlines: true }),
    'line one\nline two\\u001b[2J',
    'keepNewlines keeps only \\n',
  );
});

test('JSON: escaped where JSON.stringify leaves characters raw, and parses back to the same value', (t) => {
  const value = { agentID: 'a\u009b31m\u009d0;t\u0007\u001b[2J\u202e\u2028\u{e0041}', list: ['\u200b', 1, null], ['k\u009b']: true };
  t.true(JSON.stringify(value).includes('\u009b'), 'JSON.stringify alone leaves U+009B raw');
  for (const indent of [undefined, 2]) {
    const out = jsonForTerminal(value, indent);
    t.false(hasUnsafeForTerminal(out.replace(/\n/g, '')), out);
    t.deepEqual(JSON.parse(out), value);
  }
  t.is(jsonForTerminal('\u009b'), '"\\u009b"');
  t.is(jsonForTerminal({ a: 1 }, 2), '{\n  "a": 1\n}', 'indentation kept');
});

test('every string of a document is escaped, keys included; other values are kept', (t) => {
  const doc = { agentID: '\u009b31m', n: 3, ok: true, none: null, nested: [{ ['\u202ek']: '\u001b[2J' }] };
  t.deepEqual(escapeStringsForTerminal(doc), { agentID: '\\u009b31m', n: 3, ok: true, none: null, nested: [{ '\\u202ek': '\\u001b[2J' }] });
  t.is(doc.agentID, '\u009b31m', 'the input is not changed');
});
