/**
 * Serializes lifecycle operations per desktop: each call waits for the previous one on the same
 * key, whatever its outcome. Different desktops never wait on each other.
 */
export class KeyedMutex {
  private readonly tails = new Map<string, Promise<unknown>>();

  run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const previous = this.tails.get(key) ?? Promise.resolve();
    const next = previous.then(fn, fn);
    const tail = next.catch(() => undefined);
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    return next;
  }

  /** Resolves when every operation queued so far has settled. */
  async idle(): Promise<void> {
    await Promise.all([...this.tails.values()]);
  }
}
