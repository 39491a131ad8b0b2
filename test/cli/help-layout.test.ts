/**
 * src/cli/help-layout.ts: without --help a start does not lay out the help
 * text yargs would keep for a failure; the yargs internals it reaches are
 * still there (when yargs changes them, this fails rather than the start
 * silently getting slower again).
 */
import test from 'ava';
import yargs from 'yargs';
import { skipHelpLayout, type UsageInternals } from '../../src/cli/help-layout.js';

/** A command like Kanal's: an epilogue, a handler, a .fail() of its own; whether yargs kept a help text after running it. */
async function runCommand(skip: boolean): Promise<{ ran: boolean; cached: boolean | undefined }> {
  let ran = false;
  const y = yargs(['serve', '--port', '1'])
    .command(
      'serve',
      'Serve',
      (c) => c.option('port', { type: 'number' }).epilogue('Examples:\n  serve --port 1'),
      () => {
        ran = true;
      },
    )
    .strict()
    .fail((message) => {
      throw new Error(message);
    });
  if (skip) skipHelpLayout(y);
  await y.parseAsync();
  const usage = (y as unknown as UsageInternals).getInternalMethods?.().getUsageInstance?.();
  return { ran, cached: usage?.hasCachedHelpMessage?.() };
}

test("yargs keeps the command's help text laid out after running it", async (t) => {
  t.deepEqual(await runCommand(false), { ran: true, cached: true });
});

test('skipHelpLayout: the command runs, no help text is laid out', async (t) => {
  t.deepEqual(await runCommand(true), { ran: true, cached: false });
});

test('skipHelpLayout: --help still prints the whole help', async (t) => {
  let printed = '';
  const y = yargs(['serve', '--help'])
    .command(
      'serve',
      'Serve',
      (c) => c.epilogue('Examples:\n  serve --port 1'),
      () => undefined,
    )
    .exitProcess(false);
  skipHelpLayout(y);
  await y.parseAsync(['serve', '--help'], {}, (_err, _argv, output) => {
    printed = output;
  });
  t.regex(printed, /Examples:\n {2}serve --port 1/);
});
