#!/usr/bin/env -S node --max-semi-space-size=8
/** The `kanal` executable: refuses a Node.js it cannot run on before anything else loads, then runs the command. */
import { runtimeProblem } from './runtime.js';

const problem = runtimeProblem(process.versions.node);
if (problem === undefined) {
  void import('./commands.js').then(({ run }) => run());
} else {
  process.stderr.write(`kanal: ${problem}\n`);
  process.exitCode = 1;
}
