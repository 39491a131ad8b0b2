/** A test's workspace: a temp dir the scope removes, with a throwaway PKI in it. */
import path from 'node:path';
import { writeThrowawayPki, type ThrowawayPki } from '../../kit/pki/throwaway-pki.js';
import { scopedTempDir, type Scope } from '../../kit/launch/cleanup-scope.js';

export interface Workspace {
  dir: string;
  pki: ThrowawayPki;
}

export async function makeWorkspace(scope: Scope, prefix = 'kanal-e2e-'): Promise<Workspace> {
  const dir = scopedTempDir(scope, prefix);
  const pki = await writeThrowawayPki(path.join(dir, 'pki'));
  return { dir, pki };
}
