/**
 * The desktop's display geometry, changed with RandR from inside the guest (reading it is the
 * guest helper's `xsize`, screenshot.ts). Xvfb starts at its largest size and the init shrinks
 * the screen to 1024x768 (guest-init.ts); a resize is the same `xrandr --fb` within those bounds,
 * so it needs no restart, and being server state it is part of a memory snapshot. The answer is
 * read back from the X server, never assumed.
 */
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import type { DisplaySize, ExecOutcome, ExecSpec } from '../../driver.js';
import { KeyedMutex } from '../host/keyed-mutex.js';

type Exec = (spec: ExecSpec) => Promise<ExecOutcome>;

const DISPLAY_TIMEOUT_MS = 10_000;
// Absolute path and display: the user's env file is sourced before every exec and may set either.
const XRANDR = 'DISPLAY=:0 /usr/bin/xrandr';
const READ = `${XRANDR} --current`;

/** `Screen 0: minimum 1 x 1, current 1024 x 768, maximum 2560 x 1600` → the current size. */
export function parseCurrent(text: string): DisplaySize | null {
  const m = /current (\d+) x (\d+)/.exec(text);
  return m ? { width: Number(m[1]), height: Number(m[2]) } : null;
}

async function run(exec: Exec, command: string): Promise<ExecOutcome> {
  return exec({ command, timeoutMs: DISPLAY_TIMEOUT_MS, maxOutputBytes: 64 * 1024 });
}

export async function resizeDisplay(exec: Exec, size: DisplaySize): Promise<DisplaySize> {
  if (!Number.isInteger(size.width) || !Number.isInteger(size.height) || size.width < 1 || size.height < 1) {
    throw new AgentFailure('bad_request', 'display size must be positive integers', false);
  }
  const fb = `${size.width}x${size.height}`;
  // The same two forms the init uses; then read back what the server actually applied.
  const out = await run(exec, `${XRANDR} --output screen --off --fb ${fb} 2>/dev/null || ${XRANDR} --fb ${fb}; ${READ}`);
  const applied = parseCurrent(out.stdout);
  if (applied === null) {
    throw new AgentFailure('runtime_error', `resize failed: ${out.stderr.trim().slice(0, 200)}`, false);
  }
  return applied;
}

/**
 * SPEC (PUT …/display): the geometry survives hibernate and wake, which a memory snapshot does by
 * itself; a cold boot reverts to 1024x768, so nothing records the size beside the disk.
 * One resize of a display at a time: two interleaved would each answer the other's size.
 */
export function resizeOneAtATime(exec: Exec, size: DisplaySize, desktopId: string): Promise<DisplaySize> {
  return resizes.run(desktopId, () => resizeDisplay(exec, size));
}

const resizes = new KeyedMutex();
