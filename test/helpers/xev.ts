/**
 * What `xev` logged, as events: the integration tests of input (sandbox-input.test.ts) run an
 * `xev` window inside a desktop and read its log to see what an application would have received.
 */

/** Keymap changes xev saw between the first and the last key press. */
export function mappingChangesWhileTyping(events: XEvent[]): number {
  const first = events.findIndex((e) => e.type === 'KeyPress');
  const last = events.findLastIndex((e) => e.type === 'KeyPress');
  return events.slice(first, last).filter((e) => e.type === 'MappingNotify').length;
}

export interface XEvent {
  readonly type: string;
  readonly root: { x: number; y: number } | null;
  readonly state: number | null;
  readonly button: number | null;
  readonly keysym: string | null;
  /** XLookupString's bytes: what the key types. */
  readonly bytes: Buffer;
  readonly time: number | null;
}

/** xev prints one block per event: `KeyPress event, serial …` and indented detail lines. */
export function parseXev(text: string): XEvent[] {
  return text
    .split(/\n(?=\S)/)
    .filter((block) => /^\w+ event, /.test(block))
    .map((block) => {
      const num = (re: RegExp, radix = 10) => {
        const m = re.exec(block);
        return m?.[1] === undefined ? null : parseInt(m[1], radix);
      };
      const root = /root:\((-?\d+),(-?\d+)\)/.exec(block);
      const bytes = /XLookupString gives \d+ bytes: \(([0-9a-f ]+)\)/.exec(block)?.[1] ?? '';
      return {
        type: block.slice(0, block.indexOf(' ')),
        root: root ? { x: Number(root[1]), y: Number(root[2]) } : null,
        state: num(/state 0x([0-9a-f]+)/, 16),
        button: num(/button (\d+),/),
        keysym: /keysym 0x[0-9a-f]+, (\w+)\)/.exec(block)?.[1] ?? null,
        bytes: Buffer.from(bytes.replace(/ /g, ''), 'hex'),
        time: num(/time (\d+)/),
      };
    });
}
