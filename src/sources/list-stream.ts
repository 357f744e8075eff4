// A Kubernetes list read from the wire one item at a time. A list at
// resourceVersion "0" is answered from the API server's watch cache whole,
// whatever limit was asked for (cacher.go: "the limit is ignored for
// requests that set RV == 0"): at 100,000 Services or EndpointSlices that
// is one JSON body of hundreds of MB. Read as one string and parsed at
// once, it would cost several times its size in memory (the bytes, the
// string, the parsed tree) and, past V8's longest string (2^29 characters),
// it could not be read at all. Here the body is scanned as it arrives:
// each element of `items` is cut out and parsed on its own (at most
// maxItemBytes, the bound on one object, as on one watch event) and handed
// over; the list's `metadata` (its resourceVersion and continue token) is
// kept; the other members (kind, apiVersion) are skipped. Memory is one
// item, whatever the list's length.
//
// The scan knows only what it needs of JSON (strings and their escapes,
// nesting, the separators at the top two levels); each item and the
// metadata go through JSON.parse, which checks the rest. Bytes of
// multi-byte UTF-8 characters are never ASCII, so the structural bytes are
// found without decoding.

/** What a list says of itself besides its items. */
export interface ListMeta {
  readonly resourceVersion: string;
  readonly continue?: string;
}

/** The most a list's `metadata` may take (it holds a version, a token and a count). */
const MAX_META_BYTES = 1024 * 1024;
/** The most a top-level member's name may take (they are kind, apiVersion, metadata, items). */
const MAX_KEY_BYTES = 256;

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COMMA = 0x2c;
const COLON = 0x3a;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACKET = 0x5d;
const isSpace = (c: number): boolean => c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;

/** Where the scan is: in the list object, in its items, or past its end. */
type State = 'start' | 'key-or-end' | 'key' | 'in-key' | 'colon' | 'value' | 'after-value' | 'items' | 'item' | 'after-item' | 'done';

/**
 * One JSON value being cut out of the stream: its bytes (kept unless
 * `skip`), its nesting depth and string state, and how it ends.
 */
class Value {
  private parts: Buffer[] = [];
  private size = 0;
  private depth = 0;
  private inString = false;
  private escaped = false;
  /** A number, true, false or null: it ends at the next delimiter. */
  private primitive = false;
  private started = false;

  constructor(
    private readonly max: number,
    private readonly skip: boolean,
    private readonly what: string,
  ) {}

  /**
   * Scans `buf` from `from`; returns the index just past the value's last
   * byte, or -1 if it goes on in the next chunk. A primitive ends before
   * the delimiter that follows it, which the caller then reads.
   */
  scan(buf: Buffer, from: number): number {
    let i = from;
    if (!this.started) {
      const c = buf[i]!;
      this.started = true;
      if (c === QUOTE) this.inString = true;
      else if (c === OPEN_BRACE || c === OPEN_BRACKET) this.depth = 1;
      else this.primitive = true;
      i++;
    }
    // Where the next backslash of this chunk is: a string's end is found by
    // searching for quotes natively, and a quote is escaped only if a
    // backslash comes first.
    let backslash = -2;
    for (; i < buf.length; i++) {
      if (this.inString) {
        if (this.escaped) {
          this.escaped = false;
          continue;
        }
        const quote = buf.indexOf(QUOTE, i);
        if (backslash !== -1 && backslash < i) backslash = buf.indexOf(BACKSLASH, i);
        if (backslash !== -1 && (quote === -1 || backslash < quote)) {
          // Skip to the backslash; the byte after it is escaped.
          i = backslash;
          this.escaped = true;
          continue;
        }
        if (quote === -1) break;
        i = quote;
        this.inString = false;
        if (this.depth === 0) return this.take(buf, from, i + 1);
        continue;
      }
      const c = buf[i]!;
      if (this.primitive) {
        if (c === COMMA || c === CLOSE_BRACKET || c === CLOSE_BRACE || isSpace(c)) return this.take(buf, from, i);
      } else if (c === QUOTE) this.inString = true;
      else if (c === OPEN_BRACE || c === OPEN_BRACKET) this.depth++;
      else if (c === CLOSE_BRACE || c === CLOSE_BRACKET) {
        if (--this.depth === 0) return this.take(buf, from, i + 1);
      }
    }
    this.keep(buf.subarray(from));
    return -1;
  }

  /** The value's text, once scan() found its end. */
  text(): string {
    return (this.parts.length === 1 ? this.parts[0]! : Buffer.concat(this.parts, this.size)).toString('utf8');
  }

  private take(buf: Buffer, from: number, end: number): number {
    this.keep(buf.subarray(from, end));
    return end;
  }

  private keep(piece: Buffer): void {
    this.size += piece.length;
    if (this.size > this.max) throw new Error(`${this.what} longer than ${this.max} bytes`);
    if (!this.skip) this.parts.push(piece);
  }
}

/**
 * Reads a list (`{"kind": …, "metadata": {…}, "items": [ … ]}`) from
 * `body`, calling `onItem` with each item, parsed, in order. Throws when
 * the body is not a JSON object, `items` is not an array, an item or the
 * metadata is not JSON or is longer than its bound, or the body ends early.
 */
export async function readList(body: AsyncIterable<Buffer>, maxItemBytes: number, onItem: (item: unknown) => void): Promise<ListMeta> {
  let state: State = 'start';
  let key: Value | undefined;
  let keyName = '';
  let value: Value | undefined;
  let metadata: unknown;
  let items = 0;
  for await (const chunk of body) {
    let i = 0;
    while (i < chunk.length) {
      const c = chunk[i]!;
      switch (state) {
        case 'in-key': {
          const end = key!.scan(chunk, i);
          if (end < 0) {
            i = chunk.length;
            break;
          }
          keyName = JSON.parse(key!.text()) as string;
          key = undefined;
          state = 'colon';
          i = end;
          break;
        }
        case 'value':
        case 'item': {
          if (!value) {
            if (isSpace(c)) {
              i++;
              break;
            }
            if (state === 'value' && keyName === 'items' && c === OPEN_BRACKET) {
              state = 'items';
              i++;
              break;
            }
            const kept = keyName === 'metadata' || keyName === 'items';
            value = state === 'item' ? new Value(maxItemBytes, false, `item ${items} of the list`) : new Value(MAX_META_BYTES, !kept, `the list's ${JSON.stringify(keyName.slice(0, 64))}`);
          }
          const end = value.scan(chunk, i);
          if (end < 0) {
            i = chunk.length;
            break;
          }
          if (state === 'item') {
            onItem(parseJson(value.text(), `item ${items} of the list`));
            items++;
            state = 'after-item';
          } else {
            if (keyName === 'metadata') metadata = parseJson(value.text(), "the list's metadata");
            // No items at all is an empty list (Go's nil slice); anything else is not a list.
            if (keyName === 'items' && value.text() !== 'null') throw new Error('not a list: its items are not an array');
            state = 'after-value';
          }
          value = undefined;
          i = end;
          break;
        }
        default: {
          i++;
          if (isSpace(c)) break;
          switch (state) {
            case 'start':
              if (c !== OPEN_BRACE) throw new Error('not a list: not a JSON object');
              state = 'key-or-end';
              break;
            case 'key-or-end':
            case 'key':
              if (c === QUOTE) {
                key = new Value(MAX_KEY_BYTES, false, 'a member name of the list');
                state = 'in-key';
                i--; // the quote starts the name
              } else if (c === CLOSE_BRACE && state === 'key-or-end') state = 'done';
              else throw unexpected(c, 'a member name');
              break;
            case 'colon':
              if (c !== COLON) throw unexpected(c, "':'");
              state = 'value';
              break;
            case 'after-value':
              if (c === COMMA) state = 'key';
              else if (c === CLOSE_BRACE) state = 'done';
              else throw unexpected(c, "',' or '}'");
              break;
            case 'items':
              if (c === CLOSE_BRACKET) state = 'after-value';
              else {
                state = 'item';
                i--; // the item's first byte
              }
              break;
            case 'after-item':
              if (c === COMMA) state = 'item';
              else if (c === CLOSE_BRACKET) state = 'after-value';
              else throw unexpected(c, "',' or ']'");
              break;
            case 'done':
              throw new Error('not a list: more after its end');
          }
        }
      }
    }
  }
  if (state !== 'done') throw new Error('not a list: the body ended before the list did');
  const meta = typeof metadata === 'object' && metadata !== null ? (metadata as { resourceVersion?: unknown; continue?: unknown }) : {};
  return {
    resourceVersion: typeof meta.resourceVersion === 'string' ? meta.resourceVersion : '',
    ...(typeof meta.continue === 'string' && meta.continue !== '' ? { continue: meta.continue } : {}),
  };
}

function parseJson(text: string, what: string): unknown {
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new Error(`not a list: ${what} is not JSON (${(err as Error).message})`);
  }
}

function unexpected(c: number, wanted: string): Error {
  return new Error(`not a list: ${JSON.stringify(String.fromCharCode(c))} where ${wanted} belongs`);
}
