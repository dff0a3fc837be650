/**
 * A stopped desktop's framebuffer file without its zeros.
 *
 * Xvfb maps a file the size of its largest screen (2560x1600: 16 MiB) and paints all of it as it
 * starts, so every file block is allocated, while a screen at the default 1024x768 uses 3 MiB of
 * it and a dark desktop's pixels are zeros. Kept as written, each hibernated desktop held 16 MiB
 * of disk, each fork wrote a 16 MiB copy, and each move of an awake desktop copied 16 MiB after
 * the desktop stopped (two thirds of what it copied then). Once the dump has ended Xvfb, the
 * file's zero blocks become holes: reads still give zeros, CRIU maps the file by its path on restore,
 * and the transfer's tar (`--sparse`) and fork copies carry only the rest.
 *
 * Only ever done to a file no process maps: a process mapping it would go on writing to the
 * file replaced.
 */
import { constants as fsc } from 'node:fs';
import { lstat, open, rename, rm } from 'node:fs/promises';

/** Zero blocks of at least this size become holes (the file system's block). */
const BLOCK = 4096;
/** Read at once while copying. */
const CHUNK = 4 << 20;
const ZEROS = Buffer.alloc(BLOCK);

/**
 * Whether compacting `file` can free much: more than half of its bytes are allocated. Xvfb paints
 * the whole file as it starts, so a desktop booted since its last hibernate holds all of it; after
 * a compaction only blocks with pixels that are not zeros stay, and a restored X server allocates
 * no more than it draws (a whole 1024x768 screen: about 6 MiB of the 16). Reading 16 MiB to find
 * nothing to free took 15–40 ms under the desktop's mutex, which a move's export waited for.
 */
export async function worthCompacting(file: string): Promise<boolean> {
  const st = await lstat(file);
  return st.isFile() && st.blocks * 512 > st.size / 2;
}

/**
 * Replaces `file` with a copy whose zero blocks are holes. A copy rather than punching holes in
 * place (util-linux `fallocate --dig-holes`): that reads the file 4 KiB at a time and syncs it,
 * 35–70 ms for a framebuffer here, while the copy reads it in large pieces and the replaced
 * file's pages are simply dropped, unwritten.
 */
export async function compactFile(file: string, signal?: AbortSignal): Promise<void> {
  const tmp = `${file}.sparse`;
  await rm(tmp, { force: true });
  try {
    await copySparse(file, tmp, signal);
    signal?.throwIfAborted();
    await rename(tmp, file);
  } catch (err) {
    await rm(tmp, { force: true });
    throw err;
  }
}

/**
 * Copies `from` to a new file `to`, writing only blocks that are not all zeros: the copy has
 * holes where the source has holes or zeros. Fails if `to` exists; stops between reads once
 * `signal` is aborted.
 *
 * `from` lives where the guest writes (the framebuffer directory is bound into it), and the agent
 * reads it as the host's root: it must be a regular file reached without a symlink, or a guest
 * would have a host file of its choice copied to where it reads (a fifo would hang the copy).
 */
export async function copySparse(from: string, to: string, signal?: AbortSignal): Promise<void> {
  const src = await open(from, fsc.O_RDONLY | fsc.O_NOFOLLOW | fsc.O_NONBLOCK | fsc.O_NOCTTY);
  try {
    if (!(await src.stat()).isFile()) throw new Error(`${from} is not a regular file`);
    const dst = await open(to, 'wx', (await src.stat()).mode & 0o7777);
    try {
      const buf = Buffer.allocUnsafe(CHUNK);
      let position = 0;
      for (;;) {
        signal?.throwIfAborted();
        const { bytesRead } = await src.read(buf, 0, CHUNK, position);
        if (bytesRead === 0) break;
        // Runs of non-zero blocks are written whole; a short last block counts as non-zero.
        let start = -1;
        for (let at = 0; at < bytesRead; at += BLOCK) {
          const end = Math.min(at + BLOCK, bytesRead);
          const zero = end - at === BLOCK && buf.compare(ZEROS, 0, BLOCK, at, end) === 0;
          if (!zero && start < 0) start = at;
          if (zero && start >= 0) {
            await dst.write(buf, start, at - start, position + start);
            start = -1;
          }
        }
        if (start >= 0) await dst.write(buf, start, bytesRead - start, position + start);
        position += bytesRead;
      }
      await dst.truncate(position);
    } finally {
      await dst.close();
    }
  } finally {
    await src.close();
  }
}
