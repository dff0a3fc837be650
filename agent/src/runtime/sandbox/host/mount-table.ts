/**
 * The kernel's mount table (`/proc/<pid>/mountinfo`), read the one way every part of the runtime
 * needs it: each mount's point (octal escapes such as `\040` for a space undone), its own options
 * (`ro` or `rw` first), its filesystem type, and the filesystem's own options (the "super
 * options" after the ` - ` separator).
 */
export interface Mount {
  readonly mountPoint: string;
  readonly mountOptions: readonly string[];
  readonly fsType: string;
  readonly superOptions: readonly string[];
}

export function parseMountTable(mountinfo: string): Mount[] {
  const mounts: Mount[] = [];
  for (const line of mountinfo.split('\n')) {
    const fields = line.split(' ');
    const sep = fields.indexOf('-');
    const point = fields[4];
    const fsType = fields[sep + 1];
    if (sep < 5 || point === undefined || fsType === undefined) continue;
    mounts.push({
      mountPoint: point.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(parseInt(octal, 8))),
      mountOptions: (fields[5] ?? '').split(',').filter(Boolean),
      fsType,
      superOptions: (fields[sep + 3] ?? '').split(',').filter(Boolean),
    });
  }
  return mounts;
}
