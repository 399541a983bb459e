/**
 * `LockClient`: locks on one server or one Redis Cluster, through an
 * adapter for node-redis or ioredis.
 */

import { LongTimer, inBackground, pause } from "./background.js";
import * as cmd from "./commands.js";
import {
  InvalidOptionsError,
  LimitMismatchError,
  LockAbortedError,
  type LockError,
  LockNotHeldError,
  LockRefusedError,
  LockTimeoutError,
  QuarantineError,
  UpgradeError,
  WouldBlockError,
  classify,
  isGone,
} from "./errors.js";
import { type Backend, Lock, SharedOwner, usingLock } from "./lock.js";
import {
  type Checked,
  EXCLUSIVE,
  type HoldKind,
  type LockOptions,
  SHARED,
  check,
  checkTtl,
  permits,
} from "./options.js";
import {
  type Link,
  type Reply,
  type Transport,
  infoFields,
  redirection,
  toBigInt,
  toCount,
} from "./transport.js";

/** Past the server's own `WAIT` timeout, how long the client still waits for its answer. */
const WAIT_MARGIN_MS = 2_000;
/** How many `MOVED`/`ASK` a wait follows before it gives up. */
const MAX_REDIRECTS = 5;
/** How long the undoing of a cancelled wait waits for its release on the wait's connection. */
const UNDO_MS = 2_000;
/** The most keys one `LOCK.MACQUIRE` names (the server's bound). */
const MAX_KEYS = 64;

/** A grant's fences: `LOCK.ACQUIRE`'s one, or `LOCK.MACQUIRE`'s array in key order. */
function fencesOf(reply: Reply): bigint[] {
  return Array.isArray(reply) ? reply.map(toBigInt) : [toBigInt(reply)];
}

/** A release's holds left: `LOCK.RELEASE`'s count, or `LOCK.MRELEASE`'s array (one step, so all alike). */
function leftOf(reply: Reply): number {
  return Array.isArray(reply) ? Math.max(0, ...reply.map(toCount)) : toCount(reply);
}

/** What `LockClient.resume` needs: the hold's owner token, a lease, and optionally its fence. */
export interface ResumeOptions {
  /** The owner token the hold was taken under (`lock.owner` where it was taken). */
  owner: string;
  /** The lease from now, in ms (1 to 2^40). */
  ttl: number;
  /** The hold's fence (`lock.fence`); read from `LOCK.INFO` when absent. */
  fence?: bigint;
  /** Renew every third of the ttl (default true). */
  watchdog?: boolean;
}

function checkResume(options: ResumeOptions): { owner: string; ttl: number; fence: bigint | undefined; watchdog: boolean } {
  if (options === null || typeof options !== "object") {
    throw new InvalidOptionsError("resume(name, { owner, ttl }): options must be an object");
  }
  for (const name of Object.keys(options)) {
    if (!["owner", "ttl", "fence", "watchdog"].includes(name)) {
      throw new InvalidOptionsError(`unknown resume option '${name}' (known: owner, ttl, fence, watchdog)`);
    }
  }
  const { owner, fence } = options;
  if (typeof owner !== "string" || owner.length === 0) {
    throw new InvalidOptionsError(`owner must be a non-empty string, not ${JSON.stringify(owner)}`);
  }
  if (fence !== undefined && typeof fence !== "bigint") {
    throw new InvalidOptionsError(`fence must be a bigint, not ${typeof fence}`);
  }
  const watchdog = options.watchdog ?? true;
  if (typeof watchdog !== "boolean") {
    throw new InvalidOptionsError(`watchdog must be true or false, not ${String(watchdog)}`);
  }
  return { owner, ttl: checkTtl(options.ttl), fence, watchdog };
}

/** What `LOCK.INFO` says about a held lock. */
export interface LockInfo {
  /** The owner of an exclusive hold; `null` for a shared lock (see `holders`). */
  owner: string | null;
  /** The exclusive hold's count, or the number of owners sharing the lock. */
  count: number;
  /** The exclusive hold's fence, or the highest of the shared holds'. */
  fence: bigint;
  /** ms left on the lease (a shared lock: the latest lease among its holds). */
  ttl: number;
  /** Clients waiting for it. */
  waiters: number;
  /** `exclusive` or `shared` (servers without shared holds: `exclusive`). */
  mode: "exclusive" | "shared";
  /** A semaphore's limit; 0 when none or exclusive. */
  limit: number;
  /** Each hold, oldest first (servers without shared holds: the one owner). */
  holders: HolderInfo[];
}

/** One hold of a lock, as `LOCK.INFO` lists it. */
export interface HolderInfo {
  owner: string;
  count: number;
  fence: bigint;
  /** ms left on this hold's lease. */
  ttl: number;
  /** ms since this hold began (null where the server does not say). */
  held: number | null;
  /** The semaphore permits this hold takes (1 where the server does not say). */
  permits: number;
}

/**
 * Locks on one server or one Redis Cluster.
 *
 * ```ts
 * const locks = new LockClient(nodeRedis(client));
 * const lock = await locks.lock("order:42", { ttl: 10_000, wait: 5_000 });
 * try { await save(order, lock.fence); } finally { await lock.release(); }
 * ```
 */
export class LockClient {
  readonly #transport: Transport;
  readonly #owners = new cmd.Owners();
  readonly #backend: Backend;

  constructor(transport: Transport) {
    if (
      transport === null ||
      typeof transport !== "object" ||
      typeof transport.call !== "function" ||
      typeof transport.open !== "function"
    ) {
      throw new TypeError(
        "LockClient needs a transport: nodeRedis(client) from 'redislock-client/node-redis' " +
          "or ioredis(client) from 'redislock-client/ioredis'",
      );
    }
    this.#transport = transport;
    const call = (key: string, args: string[]) => this.#call(key, args);
    this.#backend = {
      async renew(key, owner, ttl) {
        await call(key, cmd.renew(key, owner, ttl));
      },
      async reenter(key, owner, ttl) {
        return toCount(await call(key, cmd.reenter(key, owner, ttl)));
      },
      async release(key, owner, all) {
        return toCount(await call(key, cmd.release(key, owner, all)));
      },
    };
  }

  /**
   * Takes the lock, waiting for it up to `wait` ms (the server queues
   * waiters first come, first served). Rejects with `LockTimeoutError` when
   * the wait ends first, `WouldBlockError` when `wait` is 0 and the lock is
   * held, `LockAbortedError` when `signal` aborts it.
   *
   * The wait runs on a connection of its own: a parked command blocks
   * everything pipelined behind it. Aborting takes the waiter out of the
   * server's queue, releases a grant that crossed the abort on that same
   * connection, then closes it.
   */
  async lock(name: string, options?: LockOptions): Promise<Lock> {
    return this.hold(name, options);
  }

  /** One attempt, at once: `WouldBlockError` if another owner holds the lock. */
  async tryLock(name: string, options?: Omit<LockOptions, "wait">): Promise<Lock> {
    return this.hold(name, { ...options, wait: 0 });
  }

  /**
   * The read side of a read-write lock: held beside other readers, never
   * beside the writer. Waits as `lock` does, in the same queue: readers
   * behind a waiting writer wait behind it. Each call is its own owner; to
   * read and write as one owner (a writer may read, a reader may not
   * upgrade), use a `readWriteLock(name)` handle.
   */
  async readLock(name: string, options?: LockOptions): Promise<Lock> {
    return this.hold(name, options, SHARED);
  }

  /**
   * Takes every one of `keys` together, all or none (1 to 64 distinct keys;
   * in a cluster, of one hash slot), waiting up to `wait` ms: the server
   * queues the request on every key at once and grants it when all of them
   * can be granted in the same step, never some while it waits, so locks
   * on the same keys in any order never deadlock, and no later request
   * takes any of its keys first. One `Lock` for all of them (`keys`,
   * `fences`): one watchdog renews every key with one `LOCK.MRENEW`, a loss
   * of any key is a loss of the lock, and `release()` gives every key back
   * (`LOCK.MRELEASE`). Aborting leaves nothing held on any key.
   */
  async lockKeys(keys: readonly string[], options?: LockOptions): Promise<Lock> {
    return this.#holdKeys(keys, options);
  }

  /** `lockKeys` at once: `WouldBlockError` if any key is held by another owner (nothing is held then). */
  async tryLockKeys(keys: readonly string[], options?: Omit<LockOptions, "wait">): Promise<Lock> {
    return this.#holdKeys(keys, { ...options, wait: 0 });
  }

  /**
   * Runs `fn` under a lock on every one of `keys` (`lockKeys`) and releases
   * them afterwards, as `using` does for one key.
   */
  async usingKeys<T>(
    keys: readonly string[],
    options: LockOptions | undefined,
    fn: (signal: AbortSignal, lock: Lock) => Promise<T> | T,
  ): Promise<T> {
    return usingLock(() => this.lockKeys(keys, options), fn);
  }

  async #holdKeys(keys: readonly string[], options: LockOptions | undefined): Promise<Lock> {
    if (!Array.isArray(keys) || keys.length < 1 || keys.length > MAX_KEYS) {
      throw new InvalidOptionsError(`a lock on several keys takes 1 to ${MAX_KEYS} keys`);
    }
    for (const key of keys) {
      checkName(key);
    }
    if (new Set(keys).size !== keys.length) {
      throw new InvalidOptionsError("a lock on several keys names each key once");
    }
    const list: readonly string[] = [...keys];
    return this.#acquire(list[0] as string, { ...check(options), keys: list }, undefined);
  }

  /** The read side at once, or `WouldBlockError`. */
  async tryReadLock(name: string, options?: Omit<LockOptions, "wait">): Promise<Lock> {
    return this.hold(name, { ...options, wait: 0 }, SHARED);
  }

  /** The write side of a read-write lock: the same as `lock`. */
  async writeLock(name: string, options?: LockOptions): Promise<Lock> {
    return this.hold(name, options);
  }

  /**
   * A read-write lock handle on `name` whose two sides share one owner
   * token: its writer may take the read side (a reentry of its hold, same
   * fence), and its reader asking for the write side is refused at once
   * with `UpgradeError`, never queued behind its own read hold. One handle
   * is one owner: give each task that must exclude the others its own.
   */
  readWriteLock(name: string): ReadWriteLock {
    checkName(name);
    return new ReadWriteLock(this, name, new SharedOwner(this.#owners.next()));
  }

  /**
   * A counting semaphore of `limit` permits (1 to 1,000,000) on `name`;
   * each permit is a leased hold of its own. Every user of `name` must ask
   * for the same limit while permits are held or awaited (the server
   * refuses another).
   */
  semaphore(name: string, limit: number): Semaphore {
    checkName(name);
    return new Semaphore(this, name, permits(limit));
  }

  /**
   * Continues a hold that another process took, by its owner token (and
   * fence): acquire in a scheduler, renew and release in a worker. Renews
   * it at once to `ttl` (rejects with `LockNotHeldError` if the owner does
   * not hold it), then it is a `Lock` like any other, with its watchdog
   * unless `watchdog: false`. Without `fence`, it is read from `LOCK.INFO`.
   */
  async resume(name: string, options: ResumeOptions): Promise<Lock> {
    checkName(name);
    const { owner, ttl, fence, watchdog } = checkResume(options);
    const sent = performance.now();
    try {
      await this.#backend.renew(name, owner, ttl);
    } catch (err) {
      if (isGone(err)) {
        throw new LockNotHeldError(`nothing to resume: ${owner} does not hold ${name}`, { cause: err });
      }
      throw err;
    }
    const known = fence ?? (await this.info(name))?.holders.find((h) => h.owner === owner)?.fence;
    if (known === undefined) {
      throw new LockNotHeldError(`nothing to resume: ${owner} does not hold ${name}`);
    }
    return new Lock({ backend: this.#backend, key: name, owner, fence: known, ttl, sent, watchdog });
  }

  /**
   * A hold of `kind` (see `lock`), for `Semaphore` and `ReadWriteLock`;
   * `owner`: the token of a handle whose holds share it. Every acquire of
   * this client comes through here: an ephemeral one is taken on a
   * connection of its own, whatever the call.
   */
  async hold(name: string, options?: LockOptions, kind?: HoldKind, owner?: SharedOwner): Promise<Lock> {
    checkName(name);
    return this.#acquire(name, check(options, kind), owner);
  }

  /** Every acquire, of one key (`name`) or of several (`opts.keys`, routed by the first). */
  async #acquire(name: string, opts: Checked, owner: SharedOwner | undefined): Promise<Lock> {
    if (owner === undefined) {
      return this.#acquireAs(name, opts, this.#owners.next(), undefined);
    }
    // Counted from before the send until the outcome is known: a cancelled
    // acquire through the same owner must not give back with `ALL` meanwhile.
    await owner.landed();
    owner.acquiring++;
    try {
      return await this.#acquireAs(name, opts, owner.token, owner);
    } finally {
      owner.acquiring--;
    }
  }

  async #acquireAs(name: string, opts: Checked, token: string, owner: SharedOwner | undefined): Promise<Lock> {
    if (opts.ephemeral) {
      // Bound to the connection it is granted on: one of its own, kept.
      return this.#onOwnLink(name, token, opts, owner);
    }
    if (opts.wait === 0) {
      try {
        return await this.#onShared(name, token, opts, owner);
      } catch (err) {
        throw err instanceof WouldBlockError ? await this.#notObtained(name, opts) : err;
      }
    }
    // A free lock nobody waits for is granted at once on the shared
    // connection; a busy one answers nil (the server lets no one barge in
    // ahead of its waiters), and the call joins the queue.
    try {
      return await this.#onShared(name, token, opts, owner);
    } catch (err) {
      if (!(err instanceof WouldBlockError)) {
        throw err;
      }
    }
    return this.#onOwnLink(name, token, opts, owner);
  }

  /**
   * Runs `fn` under the lock and releases it afterwards. `fn` gets the
   * lock's loss signal; if the lock was lost while `fn` ran, rejects with a
   * `LockLostError` whatever `fn` returned.
   */
  async using<T>(
    name: string,
    options: LockOptions | undefined,
    fn: (signal: AbortSignal, lock: Lock) => Promise<T> | T,
  ): Promise<T> {
    return usingLock(() => this.lock(name, options), fn);
  }

  /**
   * Closes the connections kept for the next waits. The client library's
   * own connection stays open (close it yourself); held locks are not
   * released. Idle, those connections do not keep the process alive anyway.
   */
  close(): void {
    this.#transport.close?.();
  }

  /** `LOCK.INFO`: who holds the lock now, or null if it is free. */
  async info(name: string): Promise<LockInfo | null> {
    checkName(name);
    const fields = infoFields(await this.#call(name, cmd.info(name)));
    if (fields === null) {
      return null;
    }
    const field = (n: string): Reply => fields.get(n) ?? null;
    const owner = field("owner") === null ? null : String(field("owner"));
    const count = toCount(field("count"));
    const fence = toBigInt(field("fence"));
    const ttl = toCount(field("ttl"));
    const listed = field("holders");
    const holders: HolderInfo[] = Array.isArray(listed)
      ? listed.map((entry) => holderInfo(infoFields(entry)))
      : owner === null
        ? []
        : [{ owner, count, fence, ttl, held: null, permits: 1 }];
    return {
      owner,
      count,
      fence,
      ttl,
      waiters: toCount(field("waiters")),
      mode: field("mode") === "shared" ? "shared" : "exclusive",
      limit: field("limit") === null ? 0 : toCount(field("limit")),
      holders,
    };
  }

  async #call(key: string, args: string[]): Promise<Reply> {
    try {
      return await this.#transport.call(key, args);
    } catch (err) {
      throw classify(err);
    }
  }

  /** One attempt on the shared connection, at once: `WouldBlockError` if it is held. */
  async #onShared(name: string, owner: string, opts: Checked, shared: SharedOwner | undefined): Promise<Lock> {
    if (opts.ephemeral) {
      // Bound to whatever connection carries it: never the shared one.
      throw new LockRefusedError("an ephemeral hold is never taken on the shared connection");
    }
    if (opts.signal?.aborted) {
      throw new LockAbortedError({ cause: opts.signal.reason });
    }
    const sent = performance.now();
    const attempt = this.#call(name, cmd.acquire(name, owner, opts));
    const reply = opts.signal === undefined ? await attempt : await abortable(attempt, opts.signal);
    if (reply === ABORTED) {
      this.#undo(name, owner, attempt, shared, null, opts);
      throw new LockAbortedError({ cause: opts.signal?.reason });
    }
    if (reply === null) {
      throw new WouldBlockError();
    }
    return this.#start(name, owner, fencesOf(reply), opts, sent, undefined, shared);
  }

  /**
   * Why a try was answered nil: `QuarantineError` if the lock is free and
   * the server is in its quarantine, else `WouldBlockError` (also when the
   * question itself fails).
   */
  async #notObtained(name: string, opts: Checked): Promise<LockError> {
    try {
      for (const key of opts.keys ?? [name]) {
        if ((await this.#call(name, cmd.info(key))) !== null) {
          return new WouldBlockError();
        }
      }
      const stats = String(await this.#call(name, ["INFO", "lock"]));
      const left = /^lock_quarantine_ms:(\d+)/m.exec(stats);
      return left !== null && Number(left[1]) > 0 ? new QuarantineError() : new WouldBlockError();
    } catch {
      return new WouldBlockError();
    }
  }

  /**
   * On a connection of its own: a wait (the server's `WAIT`), or an
   * ephemeral hold, which stays bound to that connection. A grant whose
   * confirming renew finds the lock gone (`NOTOWNER`: handed over, then
   * taken away, as when the master that granted it is demoted) is not a
   * hold: the call waits again with what is left of its wait.
   */
  async #onOwnLink(name: string, owner: string, opts: Checked, shared: SharedOwner | undefined): Promise<Lock> {
    const waitEnd = opts.wait === null ? null : performance.now() + opts.wait;
    for (;;) {
      const { fences, sent, link } = await this.#waitOnce(name, owner, opts, waitEnd, shared);
      if (performance.now() - sent <= opts.ttl / 3) {
        return this.#start(name, owner, fences, opts, sent, link, shared);
      }
      // The lease runs `ttl` from the grant, which the client cannot see;
      // after a long wait the send time says little of it. A renew pins it
      // from its own send time, before the watchdog starts on it.
      const renewed = performance.now();
      const confirm = this.#backendFor(opts).renew(name, owner, opts.ttl);
      const outcome = await abortable(
        confirm.then(
          () => null,
          (err: unknown) => ({ err }),
        ),
        opts.signal,
      );
      if (outcome === null) {
        return this.#start(name, owner, fences, opts, renewed, link, shared);
      }
      link?.close();
      if (outcome === ABORTED) {
        // Queued on the shared connection behind the renew: the hold goes
        // whether the renew lands or not.
        this.#releaseLater(name, owner, shared, opts);
        throw new LockAbortedError({ cause: opts.signal?.reason });
      }
      if (!isGone(outcome.err)) {
        this.#releaseLater(name, owner, shared, opts);
        throw outcome.err;
      }
      if (opts.wait === 0 || (waitEnd !== null && performance.now() >= waitEnd)) {
        throw opts.wait === 0 ? new WouldBlockError() : new LockTimeoutError();
      }
    }
  }

  /** One acquire on a connection of its own; the link is returned when it carries an ephemeral hold. */
  async #waitOnce(
    name: string,
    owner: string,
    opts: Checked,
    waitEnd: number | null,
    shared: SharedOwner | undefined,
  ): Promise<{ fences: bigint[]; sent: number; link: Link | undefined }> {
    const signal = opts.signal;
    if (signal?.aborted) {
      throw new LockAbortedError({ cause: signal.reason });
    }
    const giveUpAt = waitEnd === null ? null : waitEnd + WAIT_MARGIN_MS;
    let link: Link | null = null;
    let outcome: { kind: "reply"; reply: Reply } | { kind: "aborted" } | { kind: "late" } | { kind: "error"; error: unknown };
    let abort: (() => void) | undefined;
    let timer: LongTimer | undefined;
    // Resolves when the caller aborts or the server is late past its own
    // deadline: either way the waiter is taken out and a possible grant released.
    const interrupted = new Promise<"aborted" | "late">((resolve) => {
      abort = () => resolve("aborted");
      signal?.addEventListener("abort", abort, { once: true });
      if (giveUpAt !== null) {
        timer = new LongTimer(giveUpAt, () => resolve("late"), true);
      }
    });
    const sent = performance.now();
    let gaveUp = false;
    const attempt = (async (): Promise<Reply> => {
      let address: string | undefined;
      let ask = false;
      for (let hop = 0; ; hop++) {
        link = await this.#transport.open(name, address);
        if (gaveUp) {
          // Interrupted while connecting: nobody will close it otherwise.
          link.close();
          throw new LockAbortedError();
        }
        // A redirected wait asks the new node for what is left of the wait
        // (an ephemeral attempt with no wait sends no WAIT at all).
        const left =
          opts.wait === 0
            ? undefined
            : waitEnd === null
              ? 0
              : Math.max(1, Math.ceil(waitEnd - performance.now()));
        const args = cmd.acquire(name, owner, opts, left);
        try {
          return ask ? await link.callAfter(["ASKING"], args) : await link.call(args);
        } catch (err) {
          const moved = redirection(err);
          if (moved === null || hop >= MAX_REDIRECTS) {
            throw err;
          }
          link.close();
          link = null;
          address = moved.address;
          ask = moved.ask;
        }
      }
    })();
    try {
      outcome = await Promise.race([
        attempt.then(
          (reply) => ({ kind: "reply" as const, reply }),
          (error: unknown) => ({ kind: "error" as const, error }),
        ),
        interrupted.then((why) => {
          gaveUp = true;
          return { kind: why };
        }),
      ]);
      // The attempt may still settle after an interruption: looked at by #undo.
      attempt.catch(() => undefined);
    } finally {
      signal?.removeEventListener("abort", abort as () => void);
      timer?.clear();
    }
    const used = link as Link | null;
    switch (outcome.kind) {
      case "aborted":
        this.#undo(name, owner, attempt, shared, used, opts);
        throw new LockAbortedError({ cause: signal?.reason });
      case "late":
        this.#undo(name, owner, attempt, shared, used, opts);
        throw new LockTimeoutError("the server did not answer the wait in time");
      case "error": {
        // A connection that failed mid-wait may have been granted the lock
        // just before: release what this owner may hold.
        used?.close();
        const error = classify(outcome.error);
        if (!(error instanceof UpgradeError || error instanceof LimitMismatchError)) {
          this.#releaseLater(name, owner, shared, opts);
        }
        if (outcome.error instanceof LockAbortedError) {
          throw new LockAbortedError({ cause: signal?.reason });
        }
        throw error;
      }
      case "reply":
        break;
    }
    const granted = outcome.reply !== null;
    if (!(opts.ephemeral && granted)) {
      // Answered, nothing pending on it: it can serve the next wait (an
      // ephemeral hold's lives as long as the hold).
      used?.recycle();
    }
    if (!granted) {
      throw opts.wait === 0 ? await this.#notObtained(name, opts) : new LockTimeoutError();
    }
    return { fences: fencesOf(outcome.reply), sent, link: opts.ephemeral ? (used ?? undefined) : undefined };
  }

  #start(
    name: string,
    owner: string,
    fences: bigint[],
    opts: Checked,
    sent: number,
    bound: Link | undefined,
    shared: SharedOwner | undefined,
  ): Lock {
    return new Lock({
      bound,
      backend: bound === undefined ? this.#backendFor(opts) : this.#boundBackend(bound, opts),
      key: name,
      owner,
      fence: fences.reduce((a, b) => (b > a ? b : a)),
      keys: opts.keys,
      fences,
      ttl: opts.ttl,
      sent,
      watchdog: opts.watchdog,
      shared,
    });
  }

  /**
   * Where a lock's renewals and releases go: its key, or for a lock on
   * several keys all of them at once (`LOCK.MRENEW`, `LOCK.MRELEASE`, all
   * or none: a renewal refused because any one key is gone loses the lock).
   */
  #backendFor(opts: Checked): Backend {
    const keys = opts.keys;
    if (keys === undefined) {
      return this.#backend;
    }
    const call = (key: string, args: string[]) => this.#call(key, args);
    return {
      async renew(key, owner, ttl) {
        await call(key, cmd.mrenew(keys, owner, ttl));
      },
      reenter() {
        return Promise.reject(new InvalidOptionsError("a lock on several keys is not reentered: take another"));
      },
      async release(key, owner, all) {
        return leftOf(await call(key, cmd.mrelease(keys, owner, all)));
      },
    };
  }

  /** An ephemeral hold's: renewed on the shared connection, released over its own. */
  #boundBackend(link: Link, opts: Checked): Backend {
    const backend = this.#backendFor(opts);
    return {
      renew: backend.renew,
      reenter: backend.reenter,
      async release(name, owner, all) {
        try {
          return leftOf(await link.call(cmd.releaseOf(name, owner, all, opts.keys)));
        } catch (err) {
          throw classify(err);
        }
      },
    };
  }

  /**
   * Undoes an acquire that was cancelled (or late) while its reply may
   * have been on its way, in the background. With `link` (a wait's own
   * connection) the release goes on that connection, queued behind the
   * acquire, and `CLIENT UNBLOCK` from the shared one takes a parked
   * acquire out of the queue; the link is closed only once the release has
   * answered (closing first leaves a half-closed connection the server may
   * still grant to). A shared owner's other holds and acquires stay: while
   * it has any, only a grant seen in the reply is released, once.
   */
  #undo(
    name: string,
    owner: string,
    attempt: Promise<Reply>,
    shared: SharedOwner | undefined,
    link: Link | null,
    opts: Checked,
  ): void {
    const exclusive = shared === undefined || shared.alone();
    const releaseAll = cmd.releaseOf(name, owner, true, opts.keys);
    const undo = async (): Promise<void> => {
      let unblocked = false;
      try {
        if (link === null) {
          if (exclusive) {
            // On the shared connection, after the acquire: it undoes a grant
            // whose reply had not come back yet.
            await this.#call(name, releaseAll).catch(() => undefined);
          } else if (typeof (await attempt.catch(() => null)) === "string") {
            await this.#call(name, cmd.release(name, owner, false)).catch(() => undefined);
          }
          return;
        }
        const release = exclusive
          ? link.call(releaseAll)
          : attempt.then((reply) => (typeof reply === "string" ? (link as Link).call(cmd.release(name, owner, false)) : null));
        // Answered, even NOTOWNER (nothing was granted): the link has done its part.
        const answered = release.then(
          () => true,
          (err: unknown) => isGone(classify(err)),
        );
        void answered.then(() => (unblocked = true));
        const id = await link.id;
        const end = performance.now() + UNDO_MS;
        // Repeated: the acquire may not be parked yet when the first look
        // comes. Only a wait the lock's queue lists is woken: a command a
        // write pause postponed (the acquire not yet run, or the release
        // queued behind it) is not parked, and Redis 7.0 crashes on a
        // CLIENT UNBLOCK of a postponed client.
        while (!unblocked && id !== null && performance.now() < end) {
          const queue = await this.#transport.call(name, ["LOCK.QUEUE", name]).catch(() => null);
          if (!unblocked && listsClient(queue, id)) {
            await this.#transport.call(name, ["CLIENT", "UNBLOCK", id]).catch(() => undefined);
          }
          await Promise.race([answered, pause(50)]);
        }
        const done = await Promise.race([answered, pause(Math.max(0, end - performance.now())).then(() => false)]);
        link.close();
        if (!done && exclusive) {
          await this.#call(name, releaseAll).catch(() => undefined);
        }
      } finally {
        unblocked = true;
      }
    };
    inBackground(exclusive && shared !== undefined ? shared.giving(undo) : undo);
  }

  /** Best effort, in the background: if it fails, the lease ends by itself. */
  #releaseLater(name: string, owner: string, shared: SharedOwner | undefined, opts: Checked): void {
    if (shared !== undefined && !shared.alone()) {
      // The other side's hold (or grant on its way) is this owner's too;
      // only the lease can end a grant nobody saw.
      return;
    }
    const release = () => this.#backendFor(opts).release(name, owner, true);
    inBackground(shared === undefined ? release : shared.giving(release));
  }
}

/**
 * A read-write lock on one name whose two sides share one owner token
 * (`LockClient.readWriteLock`): the writer may read (a reentry of its own
 * hold), a reader asking for the write side gets `UpgradeError` at once.
 */
export class ReadWriteLock {
  readonly #client: LockClient;
  readonly #owner: SharedOwner;
  readonly name: string;

  constructor(client: LockClient, name: string, owner: SharedOwner) {
    this.#client = client;
    this.name = name;
    this.#owner = owner;
  }

  /** The owner token both sides hold through. */
  get owner(): string {
    return this.#owner.token;
  }

  /** The read side (a writer of this handle: a reentry of its write hold). */
  readLock(options?: LockOptions): Promise<Lock> {
    return this.#client.hold(this.name, options, SHARED, this.#owner);
  }

  /** The read side at once, or `WouldBlockError`. */
  tryReadLock(options?: Omit<LockOptions, "wait">): Promise<Lock> {
    return this.#client.hold(this.name, { ...options, wait: 0 }, SHARED, this.#owner);
  }

  /** The write side; `UpgradeError` at once while this handle holds the read side. */
  writeLock(options?: LockOptions): Promise<Lock> {
    return this.#client.hold(this.name, options, EXCLUSIVE, this.#owner);
  }

  /** The write side at once, or `WouldBlockError` (`UpgradeError` while this handle reads). */
  tryWriteLock(options?: Omit<LockOptions, "wait">): Promise<Lock> {
    return this.#client.hold(this.name, { ...options, wait: 0 }, EXCLUSIVE, this.#owner);
  }
}

/**
 * A counting semaphore on one name (`LockClient.semaphore`): each `acquire`
 * takes one permit, a `Lock` with its own fence, lease, watchdog and loss
 * signal, released as any lock is.
 *
 * ```ts
 * const pool = locks.semaphore("db:connections", 8);
 * const permit = await pool.acquire({ ttl: 10_000, wait: 5_000 });
 * try { await query(); } finally { await permit.release(); }
 * ```
 */
export class Semaphore {
  readonly #client: LockClient;
  readonly #kind: HoldKind;
  readonly name: string;

  constructor(client: LockClient, name: string, kind: HoldKind) {
    this.#client = client;
    this.name = name;
    this.#kind = kind;
  }

  /** How many permits the semaphore has. */
  get limit(): number {
    return this.#kind.kind === "permit" ? this.#kind.limit : 1;
  }

  /** Takes a permit, waiting up to `wait` ms in the server's queue. */
  acquire(options?: LockOptions): Promise<Lock> {
    return this.#client.hold(this.name, options, this.#kind);
  }

  /** One attempt, at once: `WouldBlockError` if every permit is held. */
  tryAcquire(options?: Omit<LockOptions, "wait">): Promise<Lock> {
    return this.#client.hold(this.name, { ...options, wait: 0 }, this.#kind);
  }

  /**
   * Takes `permits` of the semaphore's permits (1 to its limit) as one hold:
   * one `Lock`, one fence, one lease, one release. Waits in the server's
   * queue, first come first served: a request for more permits than are
   * free waits at the head, and smaller requests behind it wait behind it
   * (a big request is never starved by small ones).
   */
  acquirePermits(permits: number, options?: LockOptions): Promise<Lock> {
    return this.#client.hold(this.name, options, this.#several(permits));
  }

  /** `acquirePermits` at once: `WouldBlockError` if too few are free or someone waits ahead. */
  tryAcquirePermits(permits: number, options?: Omit<LockOptions, "wait">): Promise<Lock> {
    return this.#client.hold(this.name, { ...options, wait: 0 }, this.#several(permits));
  }

  #several(permits: number): HoldKind {
    const limit = this.limit;
    if (typeof permits !== "number" || !Number.isInteger(permits) || permits < 1 || permits > limit) {
      throw new InvalidOptionsError(`a semaphore's request takes 1 to its limit (${limit}) of permits, not ${String(permits)}`);
    }
    return { kind: "permit", limit, permits };
  }

  /** Runs `fn` holding a permit, as `LockClient.using` does with a lock. */
  using<T>(
    options: LockOptions | undefined,
    fn: (signal: AbortSignal, lock: Lock) => Promise<T> | T,
  ): Promise<T> {
    return usingLock(() => this.acquire(options), fn);
  }
}

const ABORTED = Symbol("aborted");

/** `work`'s result, or `ABORTED` as soon as `signal` aborts (or at once if it has). */
async function abortable<T>(work: Promise<T>, signal: AbortSignal | undefined): Promise<T | typeof ABORTED> {
  if (signal === undefined) {
    return work;
  }
  if (signal.aborted) {
    return ABORTED;
  }
  let stop: (() => void) | undefined;
  const aborted = new Promise<typeof ABORTED>((resolve) => {
    stop = () => resolve(ABORTED);
    signal.addEventListener("abort", stop, { once: true });
  });
  try {
    return await Promise.race([work, aborted]);
  } finally {
    signal.removeEventListener("abort", stop as () => void);
  }
}

function holderInfo(fields: Map<string, Reply> | null): HolderInfo {
  const field = (n: string): Reply => fields?.get(n) ?? null;
  return {
    owner: String(field("owner")),
    count: toCount(field("count")),
    fence: toBigInt(field("fence")),
    ttl: toCount(field("ttl")),
    held: field("held") === null ? null : toCount(field("held")),
    permits: field("permits") === null ? 1 : toCount(field("permits")),
  };
}

export function checkName(name: unknown): asserts name is string {
  if (typeof name !== "string" || name.length === 0) {
    throw new TypeError(`a lock name must be a non-empty string, not ${JSON.stringify(name)}`);
  }
}

/** Whether a `LOCK.QUEUE` reply lists the client `id` (RESP2 field pairs or a RESP3 map). */
function listsClient(queue: Reply | null, id: string): boolean {
  if (!Array.isArray(queue)) {
    return false;
  }
  return queue.some((entry) => {
    if (Array.isArray(entry)) {
      for (let i = 0; i + 1 < entry.length; i += 2) {
        if (entry[i] === "client" && String(entry[i + 1]) === id) {
          return true;
        }
      }
      return false;
    }
    if (entry instanceof Map) {
      return String(entry.get("client")) === id;
    }
    return entry !== null && typeof entry === "object" && String(entry["client"]) === id;
  });
}
