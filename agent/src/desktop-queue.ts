/**
 * One queue per desktop: lifecycle commands for a desktop run one at a time, in arrival order (a
 * hibernate must not snapshot a desktop that a start is still restoring), while different
 * desktops run in parallel. A chain of promises per desktop, dropped once it drains so the map
 * holds only desktops with work queued.
 */
export class DesktopQueue {
  private readonly tails = new Map<string, Promise<void>>();

  /** Runs `work` after everything queued before it for the desktop. */
  run<T>(desktopId: string, work: () => Promise<T>): Promise<T> {
    const previous = this.tails.get(desktopId) ?? Promise.resolve();
    const run = previous.then(work);
    const tail = run.then(
      () => {},
      () => {},
    );
    this.tails.set(desktopId, tail);
    void tail.then(() => {
      if (this.tails.get(desktopId) === tail) this.tails.delete(desktopId);
    });
    return run;
  }
}
