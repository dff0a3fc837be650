/**
 * Guest paths as the API takes them (docs/api.md §4.4): `{path}` is the absolute guest path without its
 * leading `/`. This module only checks and normalizes the text; what a path means is decided by
 * the kernel inside the desktop (the agent resolves it in the guest's own mount namespace and
 * root), so nothing here tries to be a security boundary beyond refusing what docs/api.md §4.4 forbids.
 *
 * Rules: a NUL byte or a `..` segment is refused; empty and `.` segments are dropped, so
 * `root//a/./b` is `/root/a/b`; the result is always absolute. An empty capture names the root,
 * which only the directory listing accepts.
 */
import { errors } from '../errors.js';

/** Longest guest path accepted, in bytes (Linux's PATH_MAX). */
export const MAX_PATH_BYTES = 4096;

export interface GuestPathOptions {
  /** The empty capture means the root (`GET .../dir/`); elsewhere it is a 400. */
  readonly allowEmpty?: boolean;
  /** Refuse the root itself, however it is spelled (`/`, `.`): DELETE. */
  readonly refuseRoot?: boolean;
}

/** Returns the normalized absolute guest path, or throws a 400 `ApiError`. */
export function guestPath(raw: string, options: GuestPathOptions = {}): string {
  if (raw === '' && !options.allowEmpty) throw errors.badRequest('path is empty');
  if (raw.includes('\0')) throw errors.badRequest('path contains a NUL byte');
  if (Buffer.byteLength(raw) > MAX_PATH_BYTES) throw errors.badRequest(`path is longer than ${MAX_PATH_BYTES} bytes`);
  const segments = raw.split('/');
  if (segments.includes('..')) throw errors.badRequest('path contains a .. segment');
  const kept = segments.filter((s) => s !== '' && s !== '.');
  if (kept.length === 0 && options.refuseRoot) throw errors.badRequest('path is the filesystem root');
  return `/${kept.join('/')}`;
}

/** The path as FileStatJson and ListDirResponse show it: without the leading `/`. */
export function apiPath(path: string): string {
  return path.slice(1);
}
