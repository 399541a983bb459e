/**
 * A held lock: `Lock`, its local lease deadline, the loss signal, and the
 * watchdog that renews it. A `Lock` works the same for one server and for
 * Redlock: it talks to a `Backend` that renews, reenters and releases (on
 * one server, or on a majority of several).
 */

import { LockLostError, LockNotHeldError, type LossReason } from "./errors.js";
import { deadline, renewPeriod, retryPeriod } from "./options.js";
import type { Link } from "./transport.js";

/** What a lock needs from where it lives. */
export interface Backend {
  /** `LOCK.RENEW`: resolves once the lease is `ttl` ms from the send time. */
  renew(key: string, owner: string, ttl: number): Promise<void>;
  /** `LOCK.REENTER` with a new lease: the new count. */
  reenter(key: string, owner: string, ttl: number): Promise<number>;
  /** `LOCK.RELEASE [ALL]`: the remaining count. */
  release(key: string, owner: string, all: boolean): Promise<number>;
}

/** Everything a `Lock` is started with. */
export interface Grant {
  backend: Backend;
  key: string;
  owner: string;
  fence: bigint;
  ttl: number;
  /** Until when the lease is surely valid (`performance.now()` ms). */
  deadline: number;
  watchdog: boolean;
  /** An ephemeral hold's own connection, kept open until the release. */
  bound?: Link;
}

/**
 * A lock held by this client. Send `fence` with every write to the
 * resource it guards. `lost` is aborted (with a `LockLostError`) when the
 * watchdog cannot renew in time or the server says this owner no longer
 * holds it.
 *
 * Release it with `release()` (one hold) or `releaseAll()`; a lock never
 * released ends with its lease (the watchdog's timers do not keep the
 * process alive).
 */
export class Lock {
  /** The lock's key. */
  readonly name: string;
  /** The owner token this lock is held as: unique per lock call. */
  readonly owner: string;
  /**
   * The fencing token, exact: a `bigint` read from the reply's digits. A
   * store that remembers the highest fence it accepted refuses lower ones.
   */
  readonly fence: bigint;
  /** The lease in ms. */
  readonly ttl: number;
  readonly #backend: Backend;
  readonly #loss = new AbortController();
  #deadline: number;
  #count = 1;
  #watchdog: Watchdog | null = null;
  readonly #autoRenew: boolean;
  #bound: Link | undefined;

  /** @internal Built by `LockClient` and `Redlock`. */
  constructor(grant: Grant) {
    this.name = grant.key;
    this.owner = grant.owner;
    this.fence = grant.fence;
    this.ttl = grant.ttl;
    this.#backend = grant.backend;
    this.#deadline = grant.deadline;
    this.#autoRenew = grant.watchdog;
    this.#bound = grant.bound;
    // The server ends an ephemeral hold when its connection closes.
    this.#bound?.onClose(() => this.lose("disconnected"));
    this.#startWatchdog();
  }

  /** Aborted when the lock is lost; its `reason` is a `LockLostError`. */
  get lost(): AbortSignal {
    return this.#loss.signal;
  }

  /** Whether the lock is lost. */
  get isLost(): boolean {
    return this.#loss.signal.aborted;
  }

  /** How many holds this lock has (reentries count); 0 once released. */
  get count(): number {
    return this.#count;
  }

  /** Until when the lease is surely valid here, on `performance.now()`'s clock. */
  get deadline(): number {
    return this.#deadline;
  }

  /** Renews the lease now (the watchdog does it by itself). */
  async renew(): Promise<void> {
    this.#held();
    const sent = performance.now();
    try {
      await this.#backend.renew(this.name, this.owner, this.ttl);
    } catch (err) {
      if (err instanceof LockNotHeldError) {
        this.lose("notowner");
      }
      throw err;
    }
    this.extend(sent);
  }

  /**
   * Takes the lock once more (reentry): count + 1, lease reset. Each
   * reentry needs its own `release()`. Resolves with the new count.
   */
  async reenter(): Promise<number> {
    this.#held();
    const sent = performance.now();
    let count: number;
    try {
      count = await this.#backend.reenter(this.name, this.owner, this.ttl);
    } catch (err) {
      if (err instanceof LockNotHeldError) {
        this.lose("notowner");
      }
      throw err;
    }
    this.extend(sent);
    this.#count = count;
    return count;
  }

  /**
   * Releases one hold; resolves with how many are left (0: the lock is
   * free). Before the last hold goes the watchdog is stopped, and a renew in
   * flight awaited, so no renew is sent after the release.
   */
  async release(): Promise<number> {
    this.#held();
    if (this.#count <= 1) {
      await this.#stopWatchdog();
    }
    try {
      const left = await this.#backend.release(this.name, this.owner, false);
      this.#count = left;
      if (left === 0) {
        this.#unbind();
      }
      if (left > 0 && this.#watchdog === null) {
        this.#startWatchdog();
      }
      return left;
    } catch (err) {
      // NOTOWNER: nothing left to hold. Anything else: the lease ends by
      // itself; either way we stop renewing it.
      await this.#stopWatchdog();
      this.#count = 0;
      this.#unbind();
      throw err;
    }
  }

  /** Releases every hold now, whatever the count. */
  async releaseAll(): Promise<void> {
    this.#held();
    await this.#stopWatchdog();
    this.#count = 0;
    try {
      await this.#backend.release(this.name, this.owner, true);
    } finally {
      this.#unbind();
    }
  }

  /** Closes an ephemeral hold's own connection, once the hold is released. */
  #unbind(): void {
    this.#bound?.close();
    this.#bound = undefined;
  }

  /** @internal A renew sent at `sent` succeeded. */
  extend(sent: number): void {
    const next = deadline(sent, this.ttl);
    // Renews can overlap (watchdog and a manual one): keep the later.
    if (next > this.#deadline && !this.isLost) {
      this.#deadline = next;
      this.#watchdog?.moved();
    }
  }

  /** @internal */
  lose(reason: LossReason): void {
    if (!this.isLost) {
      this.#loss.abort(new LockLostError(reason));
    }
  }

  #held(): void {
    if (this.#count === 0) {
      throw new LockNotHeldError("this lock was released");
    }
  }

  #startWatchdog(): void {
    this.#watchdog = new Watchdog(this, this.#backend, this.#autoRenew);
  }

  async #stopWatchdog(): Promise<void> {
    const dog = this.#watchdog;
    this.#watchdog = null;
    await dog?.stop();
  }
}

/**
 * The watchdog: renews every third of the lease while `autoRenew`, and
 * fires the loss signal on `NOTOWNER` or when the local deadline passes
 * without a renew confirming the lock. After `stop()` it sends nothing more.
 */
class Watchdog {
  #timer: NodeJS.Timeout | null = null;
  #inflight: Promise<void> | null = null;
  #stopped = false;
  #nextRenew: number;

  constructor(
    private readonly lock: Lock,
    private readonly backend: Backend,
    private readonly autoRenew: boolean,
  ) {
    this.#nextRenew = performance.now() + renewPeriod(lock.ttl);
    this.#schedule();
  }

  /** A manual renew moved the deadline. */
  moved(): void {
    if (this.#inflight === null && !this.#stopped) {
      this.#schedule();
    }
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer !== null) {
      clearTimeout(this.#timer);
      this.#timer = null;
    }
    await this.#inflight;
  }

  #schedule(): void {
    if (this.#timer !== null) {
      clearTimeout(this.#timer);
    }
    const wake = this.autoRenew
      ? Math.min(this.#nextRenew, this.lock.deadline)
      : this.lock.deadline;
    this.#timer = setTimeout(() => this.#tick(), Math.max(0, wake - performance.now()));
    // A forgotten lock must not keep the process alive: its lease ends.
    this.#timer.unref();
  }

  #tick(): void {
    this.#timer = null;
    if (this.#stopped || this.lock.isLost) {
      return;
    }
    const now = performance.now();
    if (now >= this.lock.deadline) {
      this.lock.lose("expired");
      return;
    }
    if (!this.autoRenew || now < this.#nextRenew) {
      this.#schedule();
      return;
    }
    this.#inflight = this.#renew(now).finally(() => {
      this.#inflight = null;
    });
  }

  async #renew(sent: number): Promise<void> {
    let expire: NodeJS.Timeout | undefined;
    const late = new Promise<"late">((resolve) => {
      expire = setTimeout(() => resolve("late"), Math.max(0, this.lock.deadline - sent));
      expire.unref();
    });
    const attempt = this.backend.renew(this.lock.name, this.lock.owner, this.lock.ttl).then(
      () => "ok" as const,
      (err: unknown) => (err instanceof LockNotHeldError ? ("notowner" as const) : ("failed" as const)),
    );
    const outcome = await Promise.race([attempt, late]);
    clearTimeout(expire);
    if (this.#stopped) {
      return;
    }
    switch (outcome) {
      case "ok":
        this.lock.extend(sent);
        this.#nextRenew = sent + renewPeriod(this.lock.ttl);
        break;
      case "notowner":
        this.lock.lose("notowner");
        return;
      case "late":
        this.lock.lose("expired");
        return;
      case "failed":
        // Transport trouble or no majority: try again soon; the deadline
        // check ends the retries.
        this.#nextRenew = performance.now() + retryPeriod(this.lock.ttl);
        break;
    }
    this.#schedule();
  }
}

/** `using()` of `LockClient` and `Redlock`: takes the lock with `take`, then `runHeld`. */
export async function usingLock<T>(
  take: () => Promise<Lock>,
  fn: (signal: AbortSignal, lock: Lock) => Promise<T> | T,
): Promise<T> {
  if (typeof fn !== "function") {
    throw new TypeError("using(name, options, fn): fn must be a function");
  }
  const lock = await take();
  return runHeld(lock, (signal) => fn(signal, lock));
}

/**
 * Runs `fn` under `lock` and releases it after. `fn` gets the loss signal;
 * if the lock was lost meanwhile, rejects with the `LockLostError` whatever
 * `fn` returned (its own error as the `cause`).
 */
export async function runHeld<T>(lock: Lock, fn: (signal: AbortSignal) => Promise<T> | T): Promise<T> {
  let result: { ok: true; value: T } | { ok: false; error: unknown };
  try {
    result = { ok: true, value: await fn(lock.lost) };
  } catch (error) {
    result = { ok: false, error };
  }
  const lostBefore = lock.lost.reason as LockLostError | undefined;
  let releaseError: unknown = null;
  if (lock.count > 0) {
    try {
      await lock.releaseAll();
    } catch (err) {
      releaseError = err;
    }
  }
  const lost = lostBefore ?? (lock.lost.reason as LockLostError | undefined);
  if (lost !== undefined) {
    throw new LockLostError(lost.reason, { cause: result.ok ? releaseError ?? undefined : result.error });
  }
  if (!result.ok) {
    throw result.error;
  }
  if (releaseError !== null) {
    // The release was refused: the lock was lost while `fn` ran, and the
    // watchdog had not seen it yet.
    if (releaseError instanceof LockNotHeldError) {
      throw new LockLostError("notowner", { cause: releaseError });
    }
    throw releaseError;
  }
  return result.value;
}
