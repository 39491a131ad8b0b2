// A Dockerfile read the way the builder reads it, for the image tests:
// instructions with their line continuations, stages, ARG defaults
// substituted, exec-form (JSON) arguments and LABEL pairs.
// Syntax: https://docs.docker.com/reference/dockerfile/

export interface Instruction {
  /** Upper-case keyword: FROM, RUN, COPY, LABEL, ... */
  keyword: string;
  /** The rest of the instruction, continuations joined, ARG values substituted. */
  args: string;
  /** 1-based line where it starts, for messages. */
  line: number;
}

export interface Stage {
  /** The FROM image reference, and the stage's name when it has one (FROM image AS name). */
  from: string;
  name?: string;
  instructions: Instruction[];
}

export interface CopyInstruction {
  /** --from=<stage>, when it copies out of another stage. */
  from?: string;
  sources: string[];
  destination: string;
}

/** Splits into instructions: comments and blank lines dropped, "\" continuations joined. */
export function instructions(text: string): Instruction[] {
  const out: Instruction[] = [];
  let pending: { words: string[]; line: number } | undefined;
  text.split('\n').forEach((raw, i) => {
    const trimmed = raw.trim();
    if (trimmed.startsWith('#') || (trimmed === '' && !pending)) return;
    const continued = trimmed.endsWith('\\');
    const part = continued ? trimmed.slice(0, -1).trim() : trimmed;
    pending ??= { words: [], line: i + 1 };
    if (part !== '') pending.words.push(part);
    if (continued) return;
    const joined = pending.words.join(' ');
    const m = /^(\S+)\s*(.*)$/.exec(joined);
    if (m) out.push({ keyword: m[1].toUpperCase(), args: m[2], line: pending.line });
    pending = undefined;
  });
  if (pending) throw new Error(`Dockerfile line ${pending.line}: the file ends inside a continued instruction`);
  return out;
}

/** ${NAME} and $NAME from the ARG defaults in force (build args as the file's defaults give them). */
function substitute(text: string, args: ReadonlyMap<string, string>): string {
  return text.replace(
    /\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)/g,
    (whole, a: string | undefined, b: string | undefined) => {
      const value = args.get(a ?? b ?? '');
      return value ?? whole;
    },
  );
}

/** The stages in order; ARGs declared before the first FROM apply to FROM lines, later ones within their stage. */
export function stages(text: string): Stage[] {
  const out: Stage[] = [];
  const global = new Map<string, string>();
  let scope = new Map<string, string>();
  for (const ins of instructions(text)) {
    const current = out[out.length - 1];
    if (ins.keyword === 'ARG') {
      const m = /^([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?$/.exec(ins.args.trim());
      if (!m) throw new Error(`Dockerfile line ${ins.line}: cannot read ARG ${ins.args}`);
      const value = m[2] === undefined ? (global.get(m[1]) ?? '') : unquote(substitute(m[2], scope));
      (current ? scope : global).set(m[1], value);
      if (current) current.instructions.push({ ...ins, args: ins.args });
      continue;
    }
    if (ins.keyword === 'FROM') {
      const m = /^(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$/i.exec(substitute(ins.args, global).trim());
      if (!m) throw new Error(`Dockerfile line ${ins.line}: cannot read FROM ${ins.args}`);
      out.push({ from: m[1], ...(m[2] ? { name: m[2] } : {}), instructions: [] });
      scope = new Map<string, string>();
      continue;
    }
    if (!current) throw new Error(`Dockerfile line ${ins.line}: ${ins.keyword} before the first FROM`);
    current.instructions.push({ ...ins, args: substitute(ins.args, scope) });
  }
  return out;
}

function unquote(value: string): string {
  const m = /^"((?:[^"\\]|\\.)*)"$/.exec(value.trim());
  return m ? m[1].replace(/\\(.)/g, '$1') : value.trim();
}

/** Words of a shell-form argument list: double-quoted words keep their spaces. */
function words(text: string): string[] {
  return [...text.matchAll(/"((?:[^"\\]|\\.)*)"|(\S+)/g)].map((m) => (m[1] !== undefined ? m[1].replace(/\\(.)/g, '$1') : m[2]));
}

/** The exec form's argument list (ENTRYPOINT ["/usr/local/bin/kanal"]); throws on the shell form. */
export function execForm(ins: Instruction): string[] {
  const value = JSON.parse(ins.args) as unknown;
  if (!Array.isArray(value) || !value.every((v): v is string => typeof v === 'string'))
    throw new Error(`Dockerfile line ${ins.line}: ${ins.keyword} is not in exec form (a JSON list of strings)`);
  return value;
}

/** LABEL key="value" ... pairs of every LABEL instruction in the stage. */
export function labels(stage: Stage): Map<string, string> {
  const out = new Map<string, string>();
  for (const ins of stage.instructions.filter((i) => i.keyword === 'LABEL')) {
    for (const m of ins.args.matchAll(/([A-Za-z0-9._-]+)=("(?:[^"\\]|\\.)*"|\S+)/g)) out.set(m[1], unquote(m[2]));
  }
  return out;
}

export function copies(stage: Stage): CopyInstruction[] {
  return stage.instructions
    .filter((i) => i.keyword === 'COPY')
    .map((ins) => {
      const all = words(ins.args);
      const flags = all.filter((w) => w.startsWith('--'));
      const paths = all.filter((w) => !w.startsWith('--'));
      if (paths.length < 2) throw new Error(`Dockerfile line ${ins.line}: COPY needs a source and a destination`);
      const from = flags.find((f) => f.startsWith('--from='))?.slice('--from='.length);
      return { ...(from ? { from } : {}), sources: paths.slice(0, -1), destination: paths[paths.length - 1] };
    });
}

/** The last value of a keyword in the stage (USER, ENTRYPOINT), or undefined. */
export function last(stage: Stage, keyword: string): Instruction | undefined {
  return stage.instructions.filter((i) => i.keyword === keyword).pop();
}
