/**
 * The browser libraries the console loads, served from the installed npm packages under
 * `/console/vendor/<name>/…` so the console works without a CDN or a bundler: noVNC (live screen)
 * and xterm.js with its fit addon (terminal). The packages are found the way Node finds them from
 * this file, so a source run (tsx, vitest) and a built run (`dist/cli.js`, whose npm dependencies
 * stay external) read the same `node_modules`.
 *
 * Only the files the console needs are reachable: each package lists the prefixes it may serve
 * (noVNC's ES modules load each other by relative path, so its `core/` and the pako inflater it
 * imports; xterm's module build and stylesheet). Anything else is the console's ordinary 404.
 */
import { createRequire } from 'node:module';
import { dirname, resolve, sep } from 'node:path';

interface VendorPackage {
  /** A specifier Node can resolve inside the package (its `exports` may hide package.json). */
  readonly specifier: string;
  /** How many folders up from the resolved file the package's root is. */
  readonly up: number;
  /** Paths (files, or folders ending in `/`) under the package root that may be served. */
  readonly serves: readonly string[];
}

const PACKAGES: Readonly<Record<string, VendorPackage>> = {
  novnc: { specifier: '@novnc/novnc', up: 2, serves: ['core/', 'vendor/pako/lib/'] },
  xterm: { specifier: '@xterm/xterm/package.json', up: 1, serves: ['lib/xterm.mjs', 'css/xterm.css'] },
  'xterm-addon-fit': { specifier: '@xterm/addon-fit/package.json', up: 1, serves: ['lib/addon-fit.mjs'] },
};

const roots = new Map<string, string | null>();

/** A package's folder, found once; null when it is not installed (the files are then 404). */
function packageRoot(name: string, pkg: VendorPackage): string | null {
  if (!roots.has(name)) {
    let root: string | null = null;
    try {
      root = createRequire(import.meta.url).resolve(pkg.specifier);
      for (let i = 0; i < pkg.up; i++) root = dirname(root);
    } catch {
      root = null;
    }
    roots.set(name, root);
  }
  return roots.get(name) ?? null;
}

/**
 * The file `vendor/<rest>` names, or null when it is not one the console may load. `rest` has
 * already passed the console's own checks (no dot segments, backslashes or NUL).
 */
export function vendorFile(rest: string): string | null {
  const slash = rest.indexOf('/');
  if (slash <= 0) return null;
  const name = rest.slice(0, slash);
  const inside = rest.slice(slash + 1);
  const pkg = Object.hasOwn(PACKAGES, name) ? PACKAGES[name] : undefined;
  if (pkg === undefined || !pkg.serves.some((p) => (p.endsWith('/') ? inside.startsWith(p) : inside === p))) return null;
  const root = packageRoot(name, pkg);
  if (root === null) return null;
  const file = resolve(root, inside);
  return file.startsWith(root + sep) ? file : null;
}
