/**
 * Which metrics and labels a PromQL expression relies on, and whether a
 * scraped registry has them: every selector's metric and matchers, every
 * `by`/`without`, `on`/`ignoring`/`group_*` label, `le` for
 * histogram_quantile. It reads expressions promtool has already accepted
 * (monitoring.test.ts runs `promtool check rules` first), so it reports
 * what it cannot read rather than explaining syntax errors.
 *
 * Labels flow through the expression as Prometheus computes them
 * (promql/engine.go: resultMetric, aggregation, histogram_quantile), so a
 * `by (tenant)` is checked against what its argument carries, not against
 * the metric alone.
 */

/** A label matcher of a selector: `label op "value"`. */
export interface Matcher {
  label: string;
  op: '=' | '!=' | '=~' | '!~';
  value: string;
}

export interface Selector {
  metric: string;
  matchers: Matcher[];
}

/** Label names of a metric as scraped (target labels included), or undefined for a metric not exported. */
export type LabelLookup = (metric: string) => ReadonlySet<string> | undefined;

export interface Analysis {
  selectors: Selector[];
  /** What the registry lacks, one line each, naming the metric or clause. */
  problems: string[];
}

type Token =
  | { kind: 'ident'; text: string }
  | { kind: 'number'; text: string }
  | { kind: 'duration'; text: string }
  | { kind: 'string'; text: string }
  | { kind: 'op'; text: string };

/** A value's type: a scalar or string, or an instant/range vector with the label names it can carry (`open`: unknown, check nothing). */
type Value = { kind: 'scalar' } | { kind: 'string'; text: string } | { kind: 'vector'; labels: ReadonlySet<string>; open: boolean };

const SCALAR: Value = { kind: 'scalar' };
const OPS = ['==', '!=', '>=', '<=', '=~', '!~', '>', '<', '+', '-', '*', '/', '%', '^', '=', '(', ')', '{', '}', '[', ']', ',', ':', '@'];
const DURATION = /^(?:\d+(?:ms|s|m|h|d|w|y))+/;
const NUMBER = /^(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)/;
const IDENT = /^[a-zA-Z_:][a-zA-Z0-9_:]*/;

/** Grafana's interval variables, replaced by durations so promtool and this parser read a dashboard's query. */
const GRAFANA_INTERVALS: Record<string, string> = { __rate_interval: '5m', __interval: '1m', __range: '1h' };

export function expandGrafanaIntervals(expr: string): string {
  return expr.replace(/\$\{?(__rate_interval|__interval|__range)\}?/g, (_, v: string) => GRAFANA_INTERVALS[v]);
}

export function tokenize(expr: string): Token[] {
  const out: Token[] = [];
  let i = 0;
  while (i < expr.length) {
    const rest = expr.slice(i);
    const space = /^(?:\s+|#[^\n]*)/.exec(rest);
    if (space) {
      i += space[0].length;
      continue;
    }
    const q = rest[0];
    if (q === '"' || q === "'" || q === '`') {
      let j = 1;
      let text = '';
      while (j < rest.length && rest[j] !== q) {
        if (rest[j] === '\\' && q !== '`') j++;
        text += rest[j++];
      }
      if (j >= rest.length) throw new Error(`unterminated string at ${i} in ${expr}`);
      out.push({ kind: 'string', text });
      i += j + 1;
      continue;
    }
    const d = DURATION.exec(rest) ?? undefined;
    const n = NUMBER.exec(rest) ?? undefined;
    if (d && d[0].length >= (n?.[0].length ?? 0) && !/^[a-zA-Z0-9_]/.test(rest.slice(d[0].length))) {
      out.push({ kind: 'duration', text: d[0] });
      i += d[0].length;
      continue;
    }
    if (n) {
      out.push({ kind: 'number', text: n[0] });
      i += n[0].length;
      continue;
    }
    const id = IDENT.exec(rest);
    if (id) {
      out.push({ kind: 'ident', text: id[0] });
      i += id[0].length;
      continue;
    }
    const op = OPS.find((o) => rest.startsWith(o));
    if (!op) throw new Error(`unexpected ${JSON.stringify(rest[0])} at ${i} in ${expr}`);
    out.push({ kind: 'op', text: op });
    i += op.length;
  }
  return out;
}

const AGGREGATIONS = new Set([
  'sum',
  'avg',
  'count',
  'min',
  'max',
  'group',
  'stddev',
  'stdvar',
  'topk',
  'bottomk',
  'quantile',
  'count_values',
  'limitk',
  'limit_ratio',
]);
/** Aggregations whose first argument is a parameter, not the vector. */
const WITH_PARAMETER = new Set(['topk', 'bottomk', 'quantile', 'count_values', 'limitk', 'limit_ratio']);
/** Functions whose value is a scalar whatever their arguments. */
const SCALAR_FUNCTIONS = new Set([
  'scalar',
  'time',
  'pi',
  'minute',
  'hour',
  'day_of_month',
  'day_of_week',
  'day_of_year',
  'days_in_month',
  'month',
  'year',
]);

/** Binary operators by precedence, loosest first (promql/parser/lex.go). */
const PRECEDENCE: readonly (readonly string[])[] = [
  ['or'],
  ['and', 'unless'],
  ['==', '!=', '<=', '<', '>=', '>'],
  ['+', '-'],
  ['*', '/', '%', 'atan2'],
  ['^'],
];
const precedenceOf = (op: string): number => PRECEDENCE.findIndex((ops) => ops.includes(op));

class Parser {
  private pos = 0;
  readonly selectors: Selector[] = [];
  readonly problems: string[] = [];

  constructor(
    private readonly tokens: Token[],
    private readonly lookup: LabelLookup,
  ) {}

  parse(): Value {
    const v = this.expr(0);
    if (this.pos < this.tokens.length) throw new Error(`unexpected ${this.tokens[this.pos].text} after a whole expression`);
    return v;
  }

  private peek(offset = 0): Token | undefined {
    return this.tokens[this.pos + offset];
  }

  private isOp(text: string, offset = 0): boolean {
    const t = this.peek(offset);
    return t?.kind === 'op' && t.text === text;
  }

  private isWord(text: string): boolean {
    const t = this.peek();
    return t?.kind === 'ident' && t.text.toLowerCase() === text;
  }

  private next(): Token {
    const t = this.tokens[this.pos++];
    if (!t) throw new Error('unexpected end of expression');
    return t;
  }

  private expect(text: string): void {
    const t = this.next();
    if (t.text !== text) throw new Error(`expected ${text}, found ${t.text}`);
  }

  /** `( a, b, … )` of label names. */
  private labelList(): string[] {
    this.expect('(');
    const labels: string[] = [];
    while (!this.isOp(')')) {
      labels.push(this.next().text);
      if (this.isOp(',')) this.next();
    }
    this.expect(')');
    return labels;
  }

  private binaryOperator(): string | undefined {
    const t = this.peek();
    if (!t) return undefined;
    const text = t.kind === 'ident' ? t.text.toLowerCase() : t.text;
    if ((t.kind === 'op' || t.kind === 'ident') && precedenceOf(text) >= 0) return text;
    return undefined;
  }

  private expr(minPrecedence: number): Value {
    let left = this.unary();
    for (;;) {
      const op = this.binaryOperator();
      if (op === undefined) return left;
      const prec = precedenceOf(op);
      if (prec < minPrecedence) return left;
      this.next();
      if (this.isWord('bool')) this.next();
      let on: string[] | undefined;
      let ignoring: string[] | undefined;
      let group: { side: 'left' | 'right'; labels: string[] } | undefined;
      if (this.isWord('on') || this.isWord('ignoring')) {
        const keep = this.next().text.toLowerCase() === 'on';
        const labels = this.labelList();
        if (keep) on = labels;
        else ignoring = labels;
      }
      if (this.isWord('group_left') || this.isWord('group_right')) {
        const side = this.next().text.toLowerCase() === 'group_left' ? 'left' : 'right';
        group = { side, labels: this.isOp('(') ? this.labelList() : [] };
      }
      // ^ is right-associative; the others left.
      const right = this.expr(op === '^' ? prec : prec + 1);
      left = this.combine(op, left, right, on, ignoring, group);
    }
  }

  private combine(
    op: string,
    left: Value,
    right: Value,
    on: string[] | undefined,
    ignoring: string[] | undefined,
    group: { side: 'left' | 'right'; labels: string[] } | undefined,
  ): Value {
    if (left.kind !== 'vector') return right.kind === 'vector' ? right : SCALAR;
    if (right.kind !== 'vector') return left;
    for (const l of on ?? []) {
      this.need(left, l, `on (${l}), left side`);
      this.need(right, l, `on (${l}), right side`);
    }
    for (const l of ignoring ?? [])
      this.need({ kind: 'vector', labels: union(left.labels, right.labels), open: left.open || right.open }, l, `ignoring (${l})`);
    if (op === 'and' || op === 'unless') return left;
    if (op === 'or') return { kind: 'vector', labels: union(left.labels, right.labels), open: left.open || right.open };
    if (group) {
      const [many, one] = group.side === 'left' ? [left, right] : [right, left];
      for (const l of group.labels) this.need(one, l, `group_${group.side} (${l})`);
      return { kind: 'vector', labels: union(many.labels, new Set(group.labels)), open: many.open };
    }
    // One-to-one: the left side's labels, kept to on() or without ignoring() (promql/engine.go: resultMetric).
    if (on) return { kind: 'vector', labels: new Set(on), open: false };
    if (ignoring) return { kind: 'vector', labels: minus(left.labels, ignoring), open: left.open };
    return left;
  }

  private need(v: Value, label: string, where: string): void {
    if (v.kind === 'vector' && !v.open && !v.labels.has(label)) {
      this.problems.push(`${where}: no such label among ${[...v.labels].sort().join(', ') || 'none'}`);
    }
  }

  private unary(): Value {
    if (this.isOp('-') || this.isOp('+')) {
      this.next();
      return this.unary();
    }
    return this.postfix(this.primary());
  }

  /** Range `[5m]`, subquery `[1h:1m]`, `offset 5m`, `@ 123`. */
  private postfix(v: Value): Value {
    for (;;) {
      if (this.isOp('[')) {
        while (!this.isOp(']')) this.next();
        this.next();
      } else if (this.isWord('offset')) {
        this.next();
        if (this.isOp('-')) this.next();
        this.next();
      } else if (this.isOp('@')) {
        this.next();
        const t = this.next();
        if (t.kind === 'ident') {
          this.expect('(');
          this.expect(')');
        }
      } else return v;
    }
  }

  private primary(): Value {
    const t = this.next();
    if (t.kind === 'number' || t.kind === 'duration') return SCALAR;
    if (t.kind === 'string') return { kind: 'string', text: t.text };
    if (t.kind === 'op' && t.text === '(') {
      const v = this.expr(0);
      this.expect(')');
      return v;
    }
    if (t.kind === 'op' && t.text === '{') return this.selector(undefined);
    if (t.kind !== 'ident') throw new Error(`unexpected ${t.text}`);
    const word = t.text.toLowerCase();
    if (word === 'inf' || word === 'nan') return SCALAR;
    if (AGGREGATIONS.has(word) && (this.isOp('(') || this.isWord('by') || this.isWord('without'))) return this.aggregation(word);
    if (this.isOp('(')) return this.call(t.text);
    return this.isOp('{') ? (this.next(), this.selector(t.text)) : this.selector(t.text, false);
  }

  /** After `{` (or a bare name when `braces` is false): matchers up to `}`. */
  private selector(name: string | undefined, braces = true): Value {
    const matchers: Matcher[] = [];
    while (braces && !this.isOp('}')) {
      const label = this.next().text;
      const op = this.next().text as Matcher['op'];
      const value = this.next();
      if (value.kind !== 'string') throw new Error(`matcher ${label}${op} needs a string`);
      matchers.push({ label, op, value: value.text });
      if (this.isOp(',')) this.next();
    }
    if (braces) this.next();
    const metrics = name !== undefined ? [name] : namesOf(matchers.find((m) => m.label === '__name__'));
    if (metrics === undefined) {
      this.problems.push(`a selector without a metric name, or names not spelt out: ${JSON.stringify(matchers)}`);
      return { kind: 'vector', labels: new Set(), open: true };
    }
    // Several names (`__name__=~"a|b"`): what all of them carry.
    let common: Set<string> | undefined;
    for (const metric of metrics) {
      this.selectors.push({ metric, matchers });
      const labels = this.lookup(metric);
      if (!labels) {
        this.problems.push(`${metric}: no such metric`);
        return { kind: 'vector', labels: new Set(), open: true };
      }
      for (const m of matchers) {
        if (m.label !== '__name__' && !labels.has(m.label))
          this.problems.push(`${metric}{${m.label}${m.op}"${m.value}"}: ${metric} has no label ${m.label}`);
      }
      common = common ? new Set([...common].filter((l) => labels.has(l))) : new Set(labels);
    }
    return { kind: 'vector', labels: common ?? new Set(), open: false };
  }

  private aggregation(op: string): Value {
    let grouping: { without: boolean; labels: string[] } | undefined;
    const clause = (): void => {
      if (this.isWord('by') || this.isWord('without')) {
        const without = this.next().text.toLowerCase() === 'without';
        grouping = { without, labels: this.labelList() };
      }
    };
    clause();
    const args = this.args();
    clause();
    const param = WITH_PARAMETER.has(op) ? args[0] : undefined;
    const arg = args[WITH_PARAMETER.has(op) ? 1 : 0];
    if (!arg || arg.kind !== 'vector') return SCALAR;
    for (const l of grouping?.labels ?? []) this.need(arg, l, `${op} ${grouping?.without ? 'without' : 'by'} (${l})`);
    let labels: ReadonlySet<string>;
    if (['topk', 'bottomk', 'limitk', 'limit_ratio'].includes(op)) labels = arg.labels;
    else if (!grouping) labels = new Set();
    else labels = grouping.without ? minus(arg.labels, grouping.labels) : new Set(grouping.labels);
    if (op === 'count_values' && param?.kind === 'string') labels = union(labels, new Set([param.text]));
    return { kind: 'vector', labels, open: arg.open && (grouping?.without ?? false) };
  }

  private args(): Value[] {
    this.expect('(');
    const args: Value[] = [];
    while (!this.isOp(')')) {
      args.push(this.expr(0));
      if (this.isOp(',')) this.next();
    }
    this.expect(')');
    return args;
  }

  private call(fn: string): Value {
    const args = this.args();
    if (SCALAR_FUNCTIONS.has(fn)) return SCALAR;
    if (fn === 'vector' || fn === 'absent' || fn === 'absent_over_time') return { kind: 'vector', labels: new Set(), open: false };
    const v = args.find((a) => a.kind === 'vector');
    if (!v || v.kind !== 'vector') return SCALAR;
    if (fn === 'histogram_quantile' || fn === 'histogram_fraction') {
      this.need(v, 'le', `${fn}: its histogram's le`);
      return { kind: 'vector', labels: minus(v.labels, ['le']), open: v.open };
    }
    if (fn === 'label_replace' || fn === 'label_join') {
      const strings = args.filter((a): a is { kind: 'string'; text: string } => a.kind === 'string').map((a) => a.text);
      const [dst, ...rest] = strings;
      const sources = fn === 'label_replace' ? rest.slice(1, 2) : rest.slice(1);
      for (const src of sources) if (src !== '') this.need(v, src, `${fn}: source label ${src}`);
      return { kind: 'vector', labels: union(v.labels, new Set([dst])), open: v.open };
    }
    return v;
  }
}

/** The names a `__name__` matcher selects when it spells them out: `="a"` or `=~"a|b"`; otherwise undefined. */
function namesOf(m: Matcher | undefined): string[] | undefined {
  if (m?.op === '=') return [m.value];
  if (m?.op === '=~' && /^[a-zA-Z_:][a-zA-Z0-9_:]*(\|[a-zA-Z_:][a-zA-Z0-9_:]*)*$/.test(m.value)) return m.value.split('|');
  return undefined;
}

function union(a: ReadonlySet<string>, b: ReadonlySet<string>): Set<string> {
  return new Set([...a, ...b]);
}

function minus(a: ReadonlySet<string>, drop: Iterable<string>): Set<string> {
  const out = new Set(a);
  for (const l of drop) out.delete(l);
  return out;
}

/** Reads `expr` (Grafana's interval variables expanded first) against `lookup`; throws on what it cannot read. */
export function analyse(expr: string, lookup: LabelLookup): Analysis {
  const parser = new Parser(tokenize(expandGrafanaIntervals(expr)), lookup);
  parser.parse();
  return { selectors: parser.selectors, problems: parser.problems };
}

/**
 * Label names per metric from Prometheus text exposition, with the target
 * labels a scrape adds (`job`, `instance`); a histogram's `_bucket`, `_sum`
 * and `_count` series count under their own names, as PromQL sees them.
 * A metric with a `# TYPE` line and no sample yet (a labelled counter never
 * incremented) is listed with the target labels alone.
 */
export function labelsFromExposition(
  texts: readonly string[],
  targetLabels: readonly string[] = ['job', 'instance'],
): Map<string, Set<string>> {
  const out = new Map<string, Set<string>>();
  const add = (name: string, labels: Iterable<string>): void => {
    const set = out.get(name) ?? new Set(targetLabels);
    for (const l of labels) set.add(l);
    out.set(name, set);
  };
  for (const text of texts) {
    for (const line of text.split('\n')) {
      const type = /^# TYPE (\S+) (\S+)/.exec(line);
      if (type) {
        const [, name, kind] = type;
        const names =
          kind === 'histogram'
            ? [`${name}_bucket`, `${name}_sum`, `${name}_count`]
            : kind === 'summary'
              ? [name, `${name}_sum`, `${name}_count`]
              : [name];
        for (const n of names) add(n, []);
        continue;
      }
      if (line === '' || line.startsWith('#')) continue;
      const sample = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s/.exec(line);
      if (!sample) throw new Error(`not a sample line: ${line}`);
      add(
        sample[1],
        [...(sample[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"/g)].map((m) => m[1]),
      );
    }
  }
  return out;
}
