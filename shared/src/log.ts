/**
 * Logging: one pino root logger per process, `child({component})` per component. Credentials are
 * redacted wherever they might appear in a logged object.
 */
import { pino, destination, type Logger } from 'pino';

export type { Logger };

export const REDACT_PATHS = [
  'authorization',
  '*.authorization',
  'headers.authorization',
  'req.headers.authorization',
  'token',
  '*.token',
  'secret',
  '*.secret',
  'env',
  '*.env',
  'setup_script',
  '*.setup_script',
  'host_key',
  '*.host_key',
  'password',
  '*.password',
];

/** JSON lines on stdout, or on stderr when stdout is kept for a human (`canto up`). */
export function createRootLogger(options: { level?: string; name?: string; toStderr?: boolean } = {}): Logger {
  return pino(
    {
      name: options.name ?? 'canto',
      level: options.level ?? 'info',
      redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    },
    destination({ fd: options.toStderr ? 2 : 1, sync: true }),
  );
}

/** A logger that drops everything, for tests that do not look at logs. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
