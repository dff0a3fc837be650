/** Assertions on RFC 9457 problem+json answers (docs/api.md §7). */
import { STATUS_CODES } from 'node:http';
import { expect } from 'vitest';

export interface ApiResponse {
  status: number;
  headers: Headers;
  text: string;
  json: any;
}

/** Asserts `res` is a problem+json answer with `status` and the members docs/api.md §7 requires. */
export function expectProblem(res: ApiResponse, status: number, what = ''): void {
  const label = `${what} → ${res.status} ${res.text.slice(0, 300)}`;
  expect(res.status, label).toBe(status);
  expect(res.headers.get('content-type') ?? '', label).toMatch(/^application\/problem\+json\b/);
  expect(res.json, label).toMatchObject({ type: 'about:blank', title: STATUS_CODES[status], status });
  expect(typeof res.json.detail, label).toBe('string');
  expect(res.json.detail.length, label).toBeGreaterThan(0);
}
