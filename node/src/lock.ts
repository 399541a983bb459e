/**
 * A held lock: `Lock`, its local lease deadline, the loss signal, and the
 * watchdog that renews it. A `Lock` works the same for one server and for
 * Redlock: it talks to a `Backend` that renews, reenters and releases (on
 * one server, or on a majority of several).
 */

import { Activity, LongTimer, inBackground, pause } from "./background.js";
import { LockAbortedError, LockLostError, LockNotHeldError, type LossReason, isGone } from "./errors.js";
import { checkReleaseOptions, checkTtl, deadline, renewPeriod, retryPeriod, type ReleaseOptions } from "./options.js";
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

/**
 * An owner token that several `Lock`s may hold through (both sides of one
 * `ReadWriteLock` handle), how many of them are held now and how many
 * acquires through it are under way. A lock whose owner is shared must
 * never release with `ALL`: that would end the other side's hold too. An
 * acquire cancelled with its grant maybe in flight gives back with `ALL`
 * only when nothing else holds or acquires through the owner (an acquire
 * under way may be granted before the `ALL` lands, which would end it
 * too), and new acquires through the owner wait until that `ALL` has
 * landed, so that it never comes after their grant.
 */
export class SharedOwner {
  /** Holds taken through this owner and not yet released or lost. */
  live = 0;
  /** Acquires through this owner under way (from their start to their outcome). */
  acquiring = 0;
  /** Background releases with `ALL` of this owner not yet over. */
  readonly #giving = new Set<Promise<void>>();
  constructor(readonly token: string) {}

  /** Whether the acquire asking (itself counted in `acquiring`) is all this owner has going on. */
  alone(): boolean {
    return this.live === 0 && this.acquiring <= 1;
  }

  /** `work`, a background release with `ALL`, wrapped so that new acquires wait until it is over. */
  giving(work: () => Promise<unknown>): () => Promise<unknown> {
    let over: () => void = () => undefined;
    const landed = new Promise<void>((resolve) => (over = resolve));
    this.#giving.add(landed);
    return async () => {
      try {
        return await work();
      } finally {
        this.#giving.delete(landed);
        over();
      }
    };
  }

  /** Resolves once no release with `ALL` of this owner is under way. */
  async landed(): Promise<void> {
    while (this.#giving.size > 0) {
      await Promise.all([...this.#giving]);
    }
  }
}

/** Everything a `Lock` is started with. */
export interface Grant {
  backend: Backend;
  key: string;
  owner: string;
  fence: bigint;
  /** A hold on several keys at once: every key, and its fence, in order. */
  keys?: readonly string[];
  fences?: readonly bigint[];
  ttl: number;
  /** When the confirmed acquire or renew the deadline counts from was sent (`performance.now()` ms). */
  sent: number;
  watchdog: boolean;
  /** An ephemeral hold's own connection, kept open until the release. */
  bound?: Link;
  /** Set when the owner token is shared with other holds (a read-write handle's). */
  shared?: SharedOwner;
}

/**
 * A lock held by this client. Send `fence` with every write to the
 * resource it guards. `lost` is aborted (with a `LockLostError`) when the
 * watchdog cannot renew in time, the server says this owner no longer
 * holds it, an ephemeral hold's connection closes, or a release does not
 * complete; a loss is never cleared.
 *
 * Release it with `release()` (one hold) or `releaseAll()`; a lock never
 * released ends with its lease (the watchdog's timers do not keep the
 * process alive).
 */
export class Lock {
  /** The lock's key. */
  readonly name: string;
  /**
   * The owner token this lock is held as: unique per lock call, or shared
   * by both sides of one `ReadWriteLock` handle. With `fence`, what
   * `LockClient.resume` needs to continue the hold elsewhere.
   */
  readonly owner: string;
  /**
   * The fencing token, exact: a `bigint` read from the reply's digits. A
   * store that remembers the highest fence it accepted refuses lower ones.
   */
  readonly fence: bigint;
  /**
   * The keys this lock holds: `[name]`, or for a lock on several keys
   * (`LockClient.lockKeys`) every key, in the order asked for. One lease
   * and one watchdog for all of them; lost when any one is lost.
   */
  readonly keys: readonly string[];
  /** One fence per key of `keys`, in order (`fence` is the highest). */
  readonly fences: readonly bigint[];
  readonly #backend: Backend;
  readonly #loss = new AbortController();
  #ttl: number;
  /** Send time of the latest confirmed acquire or renew: the deadline counts from it. */
  #sent: number;
  #deadline: number;
  #count = 1;
  #watchdog: Watchdog | null = null;
  #autoRenew: boolean;
  #bound: Link | undefined;
  readonly #shared: SharedOwner | undefined;
  #ended = false;

  /** @internal Built by `LockClient` and `Redlock`. */
  constructor(grant: Grant) {
    this.name = grant.key;
    this.owner = grant.owner;
    this.fence = grant.fence;
    this.keys = grant.keys ?? [grant.key];
    this.fences = grant.fences ?? [grant.fence];
    this.#ttl = grant.ttl;
    this.#sent = grant.sent;
    this.#deadline = deadline(grant.sent, grant.ttl);
    this.#backend = grant.backend;
    this.#autoRenew = grant.watchdog;
    this.#bound = grant.bound;
    this.#shared = grant.shared;
    if (this.#shared !== undefined) {
      this.#shared.live++;
    }
    // The server ends an ephemeral hold when its connection closes.
    this.#bound?.onClose(() => this.lose("disconnected"));
    this.#watchdog = new Watchdog(this, this.#backend);
  }

  /** Aborted when the lock is lost; its `reason` is a `LockLostError`. */
  get lost(): AbortSignal {
    return this.#loss.signal;
  }

  /** Whether the lock is lost. */
  get isLost(): boolean {
    return this.#loss.signal.aborted;
  }

  /** Whether this handle still holds the lock: not released, not lost. */
  get isHeld(): boolean {
    return this.#count > 0 && !this.isLost;
  }

  /** How many holds this handle has (reentries count); 0 once released or given up. */
  get count(): number {
    return this.#count;
  }

  /** The lease in ms (`renew(ttl)` changes it). */
  get ttl(): number {
    return this.#ttl;
  }

  /** Whether the watchdog renews the lease (`stopRenewing()` turns it off). */
  get autoRenew(): boolean {
    return this.#autoRenew;
  }

  /** Until when the lease is surely valid here, on `performance.now()`'s clock. */
  get deadline(): number {
    return this.#deadline;
  }

  /**
   * Renews the lease now (the watchdog does it by itself). With `ttl`, the
   * lease becomes that from now on (shorter or longer), and the watchdog
   * renews with it from then on. Rejects with the `LockLostError` if the
   * server says the lock is gone (and `lost` fires).
   */
  async renew(ttl?: number): Promise<void> {
    this.#usable();
    const next = ttl === undefined ? this.#ttl : checkTtl(ttl);
    const sent = performance.now();
    try {
      await this.#backend.renew(this.name, this.owner, next);
    } catch (err) {
      throw this.#failed(err);
    }
    this.confirmed(sent, next);
  }

  /**
   * Stops the watchdog without releasing: the hold stays until its lease
   * ends (or a `renew()`), and `lost` still fires at the local deadline.
   */
  stopRenewing(): void {
    this.#autoRenew = false;
    this.#watchdog?.moved();
  }

  /**
   * Takes the lock once more (reentry): count + 1, lease reset. Each
   * reentry needs its own `release()`. Resolves with the new count.
   */
  async reenter(): Promise<number> {
    this.#usable();
    const sent = performance.now();
    const ttl = this.#ttl;
    try {
      await this.#backend.reenter(this.name, this.owner, ttl);
    } catch (err) {
      throw this.#failed(err);
    }
    this.confirmed(sent, ttl);
    this.#count++;
    return this.#count;
  }

  /**
   * Releases one hold; resolves with how many the server still counts for
   * this owner (0: the lock is free). Before this handle's last hold goes,
   * the watchdog is stopped, and a renew in flight awaited, so no renew is
   * sent after the release.
   *
   * A release that does not complete (aborted by `signal`, a transport
   * error) rejects, and leaves the lock lost with reason
   * `"release-unconfirmed"`: the release is retried in the background until
   * it lands or the lease ends.
   */
  async release(options?: ReleaseOptions): Promise<number> {
    return this.#release(false, options);
  }

  /** Releases every hold of this handle now, whatever the count. */
  async releaseAll(options?: ReleaseOptions): Promise<void> {
    await this.#release(true, options);
  }

  async #release(all: boolean, options: ReleaseOptions | undefined): Promise<number> {
    const { signal } = checkReleaseOptions(options);
    this.#usable();
    if (signal?.aborted) {
      throw new LockAbortedError({ cause: signal.reason });
    }
    const last = all || this.#count <= 1;
    // Several holds of a shared owner: each goes with its own release.
    const times = all && this.#shared !== undefined ? this.#count : 1;
    const work = (async (): Promise<number> => {
      if (last) {
        await this.#stopWatchdog();
      }
      let left = 0;
      for (let i = 0; i < times; i++) {
        left = await this.#releaseOnce(all && this.#shared === undefined);
        this.#count--;
      }
      return left;
    })();
    const outcome = await settleOrAbort(work, signal);
    if (outcome.ok) {
      if (all || this.#count <= 0) {
        this.#count = 0;
        this.#end();
      } else if (this.#watchdog === null) {
        this.#watchdog = new Watchdog(this, this.#backend);
      }
      return outcome.value;
    }
    const err = outcome.aborted ? new LockAbortedError({ cause: signal?.reason }) : outcome.error;
    if (!outcome.aborted && isGone(err)) {
      this.#count = 0;
      throw this.#failed(err);
    }
    // Not confirmed: this handle no longer counts on the lock; the release
    // goes on in the background.
    this.#count = 0;
    this.lose("release-unconfirmed");
    this.#giveUp(work);
    throw err;
  }

  async #releaseOnce(all: boolean): Promise<number> {
    return this.#backend.release(this.name, this.owner, all);
  }

  /**
   * Makes sure the hold is released without anyone waiting for it: after
   * `pending` (a release in flight) settles, releases again until the
   * server confirms or says it is gone, or the lease ends. An ephemeral
   * hold is simply closed: the server ends it with its connection.
   */
  #giveUp(pending?: Promise<unknown>): void {
    const bound = this.#bound;
    const leaseEnd = this.#sent + this.#ttl;
    this.#end();
    inBackground(async () => {
      await this.#stopWatchdog();
      if (bound !== undefined) {
        bound.close();
        return;
      }
      const settled = pending === undefined ? false : await settleBy(pending, leaseEnd);
      if (settled && this.#shared !== undefined) {
        return;
      }
      while (performance.now() < leaseEnd) {
        try {
          // A shared owner's other holds stay: one release for this one.
          await this.#backend.release(this.name, this.owner, this.#shared === undefined);
          return;
        } catch (err) {
          if (isGone(err)) {
            return;
          }
        }
        await pause(Math.min(retryPeriod(this.#ttl), Math.max(0, leaseEnd - performance.now())));
      }
    });
  }

  /** The hold is over for this handle: closes an ephemeral hold's connection, frees its share. */
  #end(): void {
    if (this.#ended) {
      return;
    }
    this.#ended = true;
    if (this.#shared !== undefined) {
      this.#shared.live--;
    }
    this.#bound?.close();
    this.#bound = undefined;
  }

  /**
   * @internal A renew of `ttl` sent at `sent` was confirmed. Commands on one
   * connection are served in order, so the latest sent is the latest
   * served: it sets the lease, shorter or longer.
   */
  confirmed(sent: number, ttl: number): void {
    if (this.isLost || sent < this.#sent) {
      return;
    }
    this.#sent = sent;
    this.#ttl = ttl;
    this.#deadline = deadline(sent, ttl);
    this.#watchdog?.renewed(sent);
  }

  /**
   * @internal Raises the loss signal first, then stops what kept the lock:
   * nothing is done about a loss before the signal is up.
   */
  lose(reason: LossReason): void {
    if (this.isLost) {
      return;
    }
    this.#loss.abort(new LockLostError(reason));
    const dog = this.#watchdog;
    this.#watchdog = null;
    dog?.halt();
    if (reason !== "release-unconfirmed") {
      this.#count = 0;
      this.#end();
    }
  }

  /** An error from renew/reenter/release: the loss it reveals, or itself. */
  #failed(err: unknown): unknown {
    if (isGone(err)) {
      this.lose("not-owner");
      return new LockLostError("not-owner", { cause: err });
    }
    return err;
  }

  #usable(): void {
    if (this.isLost) {
      throw this.#loss.signal.reason as LockLostError;
    }
    if (this.#count === 0) {
      throw new LockNotHeldError("this lock was released");
    }
  }

  async #stopWatchdog(): Promise<void> {
    const dog = this.#watchdog;
    this.#watchdog = null;
    await dog?.stop();
  }
}

type Settled<T> = { ok: true; value: T } | { ok: false; aborted: boolean; error: unknown };

/** `work`'s outcome, or aborted as soon as `signal` aborts (`work` goes on). */
async function settleOrAbort<T>(work: Promise<T>, signal: AbortSignal | undefined): Promise<Settled<T>> {
  const settled = work.then(
    (value): Settled<T> => ({ ok: true, value }),
    (error: unknown): Settled<T> => ({ ok: false, aborted: false, error }),
  );
  if (signal === undefined) {
    return settled;
  }
  let stop: (() => void) | undefined;
  const aborted = new Promise<Settled<T>>((resolve) => {
    stop = () => resolve({ ok: false, aborted: true, error: undefined });
    signal.addEventListener("abort", stop, { once: true });
  });
  try {
    return await Promise.race([settled, aborted]);
  } finally {
    signal.removeEventListener("abort", stop as () => void);
  }
}

/** Whether `work` succeeded before `end` (`performance.now()` ms). */
async function settleBy(work: Promise<unknown>, end: number): Promise<boolean> {
  let timer: LongTimer | undefined;
  const late = new Promise<boolean>((resolve) => {
    timer = new LongTimer(end, () => resolve(false));
  });
  try {
    return await Promise.race([work.then(() => true, () => false), late]);
  } finally {
    timer?.clear();
  }
}

/**
 * The watchdog: renews every third of the lease while the lock renews
 * itself, and fires the loss signal on `NOTOWNER` (or `WRONGTYPE`) or when
 * the local deadline passes without a renew confirming the lock. After
 * `stop()` it sends nothing more. Alive, it counts as a background task.
 */
class Watchdog {
  #timer: LongTimer | null = null;
  #inflight: Promise<void> | null = null;
  #stopped = false;
  #nextRenew: number;
  readonly #activity = new Activity();

  constructor(
    private readonly lock: Lock,
    private readonly backend: Backend,
  ) {
    this.#nextRenew = performance.now() + renewPeriod(lock.ttl);
    this.#schedule();
  }

  /** A renew sent at `sent` was confirmed: the next one is a third of the (maybe new) lease later. */
  renewed(sent: number): void {
    this.#nextRenew = sent + renewPeriod(this.lock.ttl);
    this.moved();
  }

  /** The deadline, or whether the lock renews itself, changed. */
  moved(): void {
    if (this.#inflight === null && !this.#stopped) {
      this.#schedule();
    }
  }

  /** Stops at once, without waiting for a renew in flight (the lock is lost). */
  halt(): void {
    this.#stopped = true;
    this.#timer?.clear();
    this.#timer = null;
    this.#activity.end();
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    this.#timer?.clear();
    this.#timer = null;
    try {
      await this.#inflight;
    } finally {
      this.#activity.end();
    }
  }

  #schedule(): void {
    this.#timer?.clear();
    const wake = this.lock.autoRenew ? Math.min(this.#nextRenew, this.lock.deadline) : this.lock.deadline;
    // A forgotten lock must not keep the process alive: its lease ends.
    this.#timer = new LongTimer(wake, () => this.#tick());
  }

  #tick(): void {
    this.#timer = null;
    if (this.#stopped || this.lock.isLost) {
      this.#activity.end();
      return;
    }
    const now = performance.now();
    if (now >= this.lock.deadline) {
      this.lock.lose("expired");
      return;
    }
    if (!this.lock.autoRenew || now < this.#nextRenew) {
      this.#schedule();
      return;
    }
    this.#inflight = this.#renew(now).finally(() => {
      this.#inflight = null;
    });
  }

  async #renew(sent: number): Promise<void> {
    const ttl = this.lock.ttl;
    let expire: LongTimer | undefined;
    const late = new Promise<"late">((resolve) => {
      expire = new LongTimer(this.lock.deadline, () => resolve("late"));
    });
    const attempt = this.backend.renew(this.lock.name, this.lock.owner, ttl).then(
      () => "ok" as const,
      (err: unknown) => (isGone(err) ? ("gone" as const) : ("failed" as const)),
    );
    const outcome = await Promise.race([attempt, late]);
    expire?.clear();
    if (this.#stopped) {
      return;
    }
    switch (outcome) {
      case "ok":
        // Sets the next renew, unless a later renew (a manual one, maybe
        // with a new ttl) was confirmed first: it decides then.
        this.lock.confirmed(sent, ttl);
        break;
      case "gone":
        this.lock.lose("not-owner");
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
    throw releaseError;
  }
  return result.value;
}
