/**
 * Kubernetes labels and label selectors (k8s.io/apimachinery/pkg/labels):
 * `--lease-label` on the server is a label set (`k=v,k2=v2`), on the agent a
 * selector. The API server filters by selector; we parse here too so a bad
 * flag is refused at start with a message, and the API stand-in filters with
 * the same rules.
 */

export type Labels = Readonly<Record<string, string>>;

export class LabelSyntaxError extends Error {
  override readonly name = 'LabelSyntaxError';
}

// k8s.io/apimachinery/pkg/util/validation: qualified name and label value.
const NAME = /^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

function checkKey(key: string, where: string): string {
  const slash = key.lastIndexOf('/');
  const prefix = slash >= 0 ? key.slice(0, slash) : undefined;
  const name = slash >= 0 ? key.slice(slash + 1) : key;
  if (prefix !== undefined && (prefix.length === 0 || prefix.length > 253 || !DNS_SUBDOMAIN.test(prefix))) {
    throw new LabelSyntaxError(`${where}: label key ${JSON.stringify(key)} has an invalid prefix (a DNS subdomain such as example.com)`);
  }
  if (name.length === 0 || name.length > 63 || !NAME.test(name)) {
    throw new LabelSyntaxError(
      `${where}: label key ${JSON.stringify(key)}: the name part must be 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit`,
    );
  }
  return key;
}

function checkValue(value: string, where: string): string {
  if (value.length > 63 || (value.length > 0 && !NAME.test(value))) {
    throw new LabelSyntaxError(
      `${where}: label value ${JSON.stringify(value)} must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit`,
    );
  }
  return value;
}

/** `k=v,k2=v2` (upstream's util.ParseLabels, with Kubernetes' key and value rules). */
export function parseLabels(text: string, flag = 'labels'): Labels {
  const labels: Record<string, string> = {};
  for (const part of text.split(',')) {
    const eq = part.indexOf('=');
    if (eq < 0) throw new LabelSyntaxError(`${flag}: ${JSON.stringify(part)} is not key=value`);
    const key = checkKey(part.slice(0, eq).trim(), flag);
    if (key in labels) throw new LabelSyntaxError(`${flag}: label ${JSON.stringify(key)} given twice`);
    labels[key] = checkValue(part.slice(eq + 1).trim(), flag);
  }
  return labels;
}

/** Sorted `k=v,k2=v2`, as labels.FormatLabels: the selector that matches exactly these labels. */
export function formatLabels(labels: Labels): string {
  return Object.keys(labels)
    .sort()
    .map((k) => `${k}=${labels[k]}`)
    .join(',');
}

type Requirement = { key: string; op: 'exists' | 'absent' } | { key: string; op: 'in' | 'notin'; values: ReadonlySet<string> };

/** A parsed label selector; the empty selector matches everything. */
export class LabelSelector {
  private constructor(
    private readonly requirements: readonly Requirement[],
    /** The selector as given, for the API's `labelSelector` query parameter. */
    readonly text: string,
  ) {}

  /**
   * Equality (`k=v`, `k==v`, `k!=v`), set (`k in (a,b)`, `k notin (a,b)`)
   * and existence (`k`, `!k`) requirements, comma-separated: all must hold.
   */
  static parse(text: string, flag = 'label selector'): LabelSelector {
    const requirements: Requirement[] = [];
    for (const part of splitTopLevel(text, flag)) {
      requirements.push(parseRequirement(part, flag));
    }
    return new LabelSelector(requirements, text.trim());
  }

  matches(labels: Labels | undefined): boolean {
    const get = (k: string): string | undefined => (labels && Object.hasOwn(labels, k) ? labels[k] : undefined);
    return this.requirements.every((r) => {
      const v = get(r.key);
      switch (r.op) {
        case 'exists':
          return v !== undefined;
        case 'absent':
          return v === undefined;
        case 'in':
          return v !== undefined && r.values.has(v);
        case 'notin':
          return v === undefined || !r.values.has(v);
      }
    });
  }
}

/** Splits on commas outside parentheses; empty text → no requirements. */
function splitTopLevel(text: string, flag: string): string[] {
  if (text.trim() === '') return [];
  const parts: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '(') depth++;
    else if (c === ')') depth--;
    if (depth < 0 || depth > 1) throw new LabelSyntaxError(`${flag}: unbalanced parentheses in ${JSON.stringify(text)}`);
    if (c === ',' && depth === 0) {
      parts.push(text.slice(start, i));
      start = i + 1;
    }
  }
  if (depth !== 0) throw new LabelSyntaxError(`${flag}: unbalanced parentheses in ${JSON.stringify(text)}`);
  parts.push(text.slice(start));
  return parts.map((p) => p.trim());
}

function parseRequirement(part: string, flag: string): Requirement {
  if (part === '') throw new LabelSyntaxError(`${flag}: empty requirement (two commas in a row?)`);
  const set = /^(\S+)\s+(in|notin)\s*\((.*)\)$/.exec(part);
  if (set) {
    const values = set[3].split(',').map((v) => checkValue(v.trim(), flag));
    return { key: checkKey(set[1], flag), op: set[2] === 'in' ? 'in' : 'notin', values: new Set(values) };
  }
  const eq = /^([^=!\s]+)\s*(==|=|!=)\s*(\S*)$/.exec(part);
  if (eq) {
    const values = new Set([checkValue(eq[3], flag)]);
    return { key: checkKey(eq[1], flag), op: eq[2] === '!=' ? 'notin' : 'in', values };
  }
  if (part.startsWith('!')) return { key: checkKey(part.slice(1).trim(), flag), op: 'absent' };
  if (/^[^\s=!<>()]+$/.test(part)) return { key: checkKey(part, flag), op: 'exists' };
  throw new LabelSyntaxError(`${flag}: cannot parse ${JSON.stringify(part)} (use k=v, k!=v, k in (a,b), k notin (a,b), k or !k)`);
}
