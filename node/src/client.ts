/**
 * `LockClient`: locks on one server or one Redis Cluster, through an
 * adapter for node-redis or ioredis.
 */

import * as cmd from "./commands.js";
import {
  LockAbortedError,
  LockNotHeldError,
  LockTimeoutError,
  WouldBlockError,
  classify,
} from "./errors.js";
import { type Backend, Lock, usingLock } from "./lock.js";
import {
  type Checked,
  type HoldKind,
  type LockOptions,
  SHARED,
  check,
  deadline,
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
   * everything pipelined behind it. Aborting closes that connection, so the
   * server drops the waiter, and releases a grant that crossed the abort.
   */
  async lock(name: string, options?: LockOptions): Promise<Lock> {
    return this.hold(name, options);
  }

  /**
   * The read side of a read-write lock: held beside other readers, never
   * beside the writer (`writeLock`). Waits as `lock` does, in the same
   * queue: readers behind a waiting writer wait behind it. The lock has
   * its own fence, lease and watchdog.
   */
  async readLock(name: string, options?: LockOptions): Promise<Lock> {
    return this.hold(name, options, SHARED);
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
   * A counting semaphore of `limit` permits (1 to 1,000,000) on `name`;
   * each permit is a leased hold of its own. Every user of `name` must ask
   * for the same limit while permits are held or awaited (the server
   * refuses another).
   */
  semaphore(name: string, limit: number): Semaphore {
    checkName(name);
    return new Semaphore(this, name, permits(limit));
  }

  /** A hold of `kind` (see `lock`). For `Semaphore`. */
  async hold(name: string, options?: LockOptions, kind?: HoldKind): Promise<Lock> {
    checkName(name);
    const opts = check(options, kind);
    if (opts.ephemeral) {
      // Bound to the connection it is granted on: one of its own, kept.
      return this.#wait(name, opts);
    }
    if (opts.wait === 0) {
      return this.#tryOnce(name, opts);
    }
    // A free lock nobody waits for is granted at once on the shared
    // connection; a busy one answers nil (the server lets no one barge in
    // ahead of its waiters), and the call joins the queue.
    try {
      return await this.#tryOnce(name, opts);
    } catch (err) {
      if (!(err instanceof WouldBlockError)) {
        throw err;
      }
    }
    return this.#wait(name, opts);
  }

  /** One attempt, at once: `WouldBlockError` if another owner holds the lock. */
  async tryLock(name: string, options?: Omit<LockOptions, "wait">): Promise<Lock> {
    checkName(name);
    return this.#tryOnce(name, check({ ...options, wait: 0 }));
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
        : [{ owner, count, fence, ttl, held: null }];
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

  async #tryOnce(name: string, opts: Checked): Promise<Lock> {
    if (opts.signal?.aborted) {
      throw new LockAbortedError({ cause: opts.signal.reason });
    }
    const owner = this.#owners.next();
    const sent = performance.now();
    const attempt = this.#call(name, cmd.acquire(name, owner, opts.ttl, opts.hold));
    const reply = opts.signal === undefined ? await attempt : await abortable(attempt, opts.signal);
    if (reply === ABORTED) {
      // The release follows the acquire on the same connection: it undoes
      // a grant whose reply had not come back yet.
      attempt.catch(() => undefined);
      this.#releaseLater(name, owner);
      throw new LockAbortedError({ cause: opts.signal?.reason });
    }
    if (reply === null) {
      throw new WouldBlockError();
    }
    return this.#start(name, owner, toBigInt(reply), opts, deadline(sent, opts.ttl));
  }

  async #wait(name: string, opts: Checked): Promise<Lock> {
    const signal = opts.signal;
    if (signal?.aborted) {
      throw new LockAbortedError({ cause: signal.reason });
    }
    const owner = this.#owners.next();
    const started = performance.now();
    const waitEnd = opts.wait === null ? null : started + opts.wait;
    const giveUpAt = waitEnd === null ? null : waitEnd + WAIT_MARGIN_MS;
    let link: Link | null = null;
    let outcome: { kind: "reply"; reply: Reply } | { kind: "aborted" } | { kind: "late" } | { kind: "error"; error: unknown };
    let abort: (() => void) | undefined;
    let timer: NodeJS.Timeout | undefined;
    // Resolves when the caller aborts or the server is late past its own
    // deadline: either way the link is closed and a possible grant released.
    const interrupted = new Promise<"aborted" | "late">((resolve) => {
      abort = () => resolve("aborted");
      signal?.addEventListener("abort", abort, { once: true });
      if (giveUpAt !== null) {
        timer = setTimeout(() => resolve("late"), giveUpAt - performance.now());
      }
    });
    const sent = performance.now();
    let gaveUp = false;
    try {
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
          const args = cmd.acquire(name, owner, opts.ttl, opts.hold, left, opts.ephemeral);
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
      // The attempt may still settle after an interruption: nothing to do then.
      attempt.catch(() => undefined);
    } finally {
      signal?.removeEventListener("abort", abort as () => void);
      clearTimeout(timer);
    }
    const used = link as Link | null;
    const bound = opts.ephemeral && outcome.kind === "reply" && outcome.reply !== null;
    if (outcome.kind === "reply") {
      // Answered, nothing pending on it: it can serve the next wait (unless
      // an ephemeral hold was granted on it: then it lives as long as the hold).
      if (!bound) {
        used?.recycle();
      }
    } else {
      // Closing it is what takes a parked waiter out of the server's queue.
      used?.close();
    }
    switch (outcome.kind) {
      case "aborted":
        // The link is closed, so the server drops the waiter; a grant that
        // crossed the abort is released (the owner is this call's alone).
        this.#releaseLater(name, owner);
        throw new LockAbortedError({ cause: signal?.reason });
      case "late":
        this.#releaseLater(name, owner);
        throw new LockTimeoutError("the server did not answer the wait in time");
      case "error":
        // A connection that failed mid-wait may have been granted the lock
        // just before: release what this owner may hold.
        this.#releaseLater(name, owner);
        if (outcome.error instanceof LockAbortedError) {
          throw new LockAbortedError({ cause: signal?.reason });
        }
        throw classify(outcome.error);
      case "reply":
        break;
    }
    if (outcome.reply === null) {
      throw opts.wait === 0 ? new WouldBlockError() : new LockTimeoutError();
    }
    const fence = toBigInt(outcome.reply);
    let until: number;
    if (performance.now() - sent > opts.ttl / 3) {
      // The lease runs `ttl` from the grant, which the client cannot see;
      // after a long wait the send time says little of it. A renew pins it
      // from its own send time, before the watchdog starts on it.
      const renewed = performance.now();
      try {
        await this.#backend.renew(name, owner, opts.ttl);
      } catch (err) {
        if (!(err instanceof LockNotHeldError)) {
          this.#releaseLater(name, owner);
        }
        if (bound) {
          used?.close();
        }
        throw err;
      }
      until = deadline(renewed, opts.ttl);
    } else {
      until = deadline(sent, opts.ttl);
    }
    return this.#start(name, owner, fence, opts, until, bound ? (used ?? undefined) : undefined);
  }

  #start(name: string, owner: string, fence: bigint, opts: Checked, until: number, bound?: Link): Lock {
    return new Lock({
      bound,
      backend: this.#backend,
      key: name,
      owner,
      fence,
      ttl: opts.ttl,
      deadline: until,
      watchdog: opts.watchdog,
    });
  }

  /** Best effort: if it fails, the lease ends by itself. */
  #releaseLater(name: string, owner: string): void {
    this.#backend.release(name, owner, true).catch(() => undefined);
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

  /** Runs `fn` holding a permit, as `LockClient.using` does with a lock. */
  using<T>(
    options: LockOptions | undefined,
    fn: (signal: AbortSignal, lock: Lock) => Promise<T> | T,
  ): Promise<T> {
    return usingLock(() => this.acquire(options), fn);
  }
}

const ABORTED = Symbol("aborted");

/** `work`'s result, or `ABORTED` as soon as `signal` aborts. */
async function abortable<T>(work: Promise<T>, signal: AbortSignal): Promise<T | typeof ABORTED> {
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
  };
}

export function checkName(name: unknown): asserts name is string {
  if (typeof name !== "string" || name.length === 0) {
    throw new TypeError(`a lock name must be a non-empty string, not ${JSON.stringify(name)}`);
  }
}
