/**
 * What the client leaves running between calls: timers armed in steps (a
 * lease or a wait may last up to 2^40 ms, `setTimeout` only 2^31 − 1), and
 * the count of background activities alive (watchdogs, the clean-up after a
 * cancelled call, releases retried in the background), which
 * `backgroundTasks()` reports so a test or an application can check that
 * nothing was left behind.
 */

/** The longest delay `setTimeout` takes; a longer one fires at once (with a warning). */
export const MAX_TIMER_MS = 2 ** 31 - 1;

let running = 0;

/**
 * How many background activities of this package are alive: one per lock
 * whose watchdog still runs (renewing, or watching the deadline), plus any
 * clean-up after a cancelled call or a release being retried. 0 once every
 * lock is released or lost and every clean-up is done.
 */
export function backgroundTasks(): number {
  return running;
}

/** One background activity, counted from `new` until `end()` (once). */
export class Activity {
  #ended = false;
  constructor() {
    running++;
  }
  end(): void {
    if (!this.#ended) {
      this.#ended = true;
      running--;
    }
  }
}

/** Runs `work` in the background, counted while it runs; its errors are dropped. */
export function inBackground(work: () => Promise<unknown>): void {
  const activity = new Activity();
  void (async () => {
    try {
      await work();
    } catch {
      // Best effort: what it undoes ends with its lease anyway.
    } finally {
      activity.end();
    }
  })();
}

/**
 * A timer that fires at `at` (`performance.now()` ms), however far away:
 * beyond `setTimeout`'s range it is armed in steps of at most 2^31 − 1 ms,
 * each step re-armed once when it ends, never in a loop.
 */
export class LongTimer {
  #handle: NodeJS.Timeout | null = null;

  /** `keepAlive`: whether the timer keeps the process alive (a forgotten lock must not). */
  constructor(
    private readonly at: number,
    private readonly fire: () => void,
    private readonly keepAlive = false,
  ) {
    this.#arm();
  }

  #arm(): void {
    const left = this.at - performance.now();
    const step = Math.min(MAX_TIMER_MS, Math.max(0, Math.ceil(left)));
    this.#handle = setTimeout(() => {
      this.#handle = null;
      // Only a capped step is followed by another; an uncapped one fires,
      // even a fraction of a millisecond early.
      if (step === MAX_TIMER_MS && this.at - performance.now() > 1) {
        this.#arm();
      } else {
        this.fire();
      }
    }, step);
    if (!this.keepAlive) {
      this.#handle.unref();
    }
  }

  clear(): void {
    if (this.#handle !== null) {
      clearTimeout(this.#handle);
      this.#handle = null;
    }
  }
}

/**
 * Resolves after `ms` (any length). It does not keep the process alive: a
 * background retry must not outlive an application that has finished.
 */
export function pause(ms: number): Promise<void> {
  return new Promise((resolve) => {
    new LongTimer(performance.now() + ms, resolve);
  });
}
