/**
 * `kanal install-node` writes each file beside its target and renames it
 * into place (src/cli/install/apply.ts): the temporary name is predictable,
 * so it is created with O_EXCL and its mode set on the descriptor; a link
 * left at that name (by another user, or a crashed run) is removed, never
 * written through.
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { applyPlan } from '../../src/cli/install/apply.js';
import { scopedTempDir } from '../../kit/launch/cleanup-scope.js';

test('a link at the temporary name is not followed: the file and the copied program land in place, the link target is untouched', (t) => {
  const root = scopedTempDir(t, 'kanal-install-');
  const elsewhere = scopedTempDir(t, 'kanal-install-target-');
  const precious = path.join(elsewhere, 'precious');
  fs.writeFileSync(precious, 'precious\n', { mode: 0o600 });
  const source = path.join(elsewhere, 'kanal-program');
  fs.writeFileSync(source, 'program bytes\n', { mode: 0o755 });
  const unit = '/etc/systemd/system/kanal-agent.service';
  const program = '/usr/local/bin/kanal';
  for (const p of [unit, program]) {
    const file = path.join(root, p);
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fs.symlinkSync(precious, `${file}.kanal-tmp-${process.pid}`);
  }
  applyPlan(root, [
    { path: unit, kind: 'file', content: Buffer.from('[Unit]\n'), mode: 0o644 },
    { path: program, kind: 'copy', source, mode: 0o755 },
  ]);
  t.is(fs.readFileSync(precious, 'utf8'), 'precious\n', 'the link target is untouched');
  t.is((fs.statSync(precious).mode & 0o777).toString(8), '600', 'and keeps its mode');
  t.is(fs.readFileSync(path.join(root, unit), 'utf8'), '[Unit]\n');
  t.is((fs.lstatSync(path.join(root, unit)).mode & 0o777).toString(8), '644');
  t.is(fs.readFileSync(path.join(root, program), 'utf8'), 'program bytes\n');
  t.is((fs.lstatSync(path.join(root, program)).mode & 0o777).toString(8), '755');
  for (const p of [unit, program]) t.false(fs.existsSync(path.join(root, `${p}.kanal-tmp-${process.pid}`)), 'no temporary left');
});
