/**
 * Redlock: one lock over N independent servers (N odd, at least 3), each
 * running the module, with fences that rise from holder to holder.
 *
 * Acquiring: one round sends `LOCK.ACQUIRE key owner ttl` to every server
 * at once, each with a short timeout. The lock is ours when a majority
 * (N/2 + 1) granted it and time is left: `ttl − elapsed − drift > 0`, drift
 * being 1 % of the ttl + 2 ms. Otherwise the round releases on every server
 * and `lock` tries again after a random delay.
 *
 * Fences that rise: each server issues its own fences. The client takes the
 * highest fence the majority returned, F, and raises each of those servers
 * to it with `LOCK.FENCE key owner F`; it hands F out only once a majority
 * has answered that round. Every server of that majority then issues only
 * fences above F; the next holder's majority shares at least one of them,
 * which granted it only after our hold there ended (after our raise), so
 * the next holder's fence is above F. No clock assumption is needed.
 *
 * Cancelling: aborting a `lock` or `tryLock` (its `signal`) gives the lock
 * up: `LOCK.RELEASE key owner ALL` goes to every server in the background,
 * each on the connection its `LOCK.ACQUIRE` went on, after it, so a server
 * that grants only after the abort (a slow one) is released too.
 */

import * as cmd from "./commands.js";
import {
  InvalidOptionsError,
  LockAbortedError,
  LockNotHeldError,
  LockRefusedError,
  LockTimeoutError,
  ModuleNotLoadedError,
  NoQuorumError,
  classify,
} from "./errors.js";
import { checkName } from "./client.js";
import { type Backend, Lock, usingLock } from "./lock.js";
import { type Checked, type LockOptions, check, deadline } from "./options.js";
import { type Reply, type Transport, toBigInt, toCount } from "./transport.js";

/** Options of a `Redlock`. */
export interface RedlockOptions {
  /** How long each server gets to answer one command, in ms (default 50). */
  serverTimeout?: number;
  /** Between two rounds of `lock`, a random delay up to this, in ms (default 100). */
  retryDelay?: number;
}

/** A server that did not answer within the server timeout. */
class ServerTimeout extends Error {}

type Outcome<T> = { ok: true; value: T } | { ok: false; error: unknown };

/** A lock over N independent servers; see the module comment for the design. */
export class Redlock {
  readonly #servers: readonly Transport[];
  readonly #quorum: number;
  readonly #serverTimeout: number;
  readonly #retryDelay: number;
  readonly #owners = new cmd.Owners();
  readonly #backend: Backend;
  /** Tests only: skip the fence round, to show that fences may then go down. */
  #skipFenceRound = false;

  constructor(servers: readonly Transport[], options: RedlockOptions = {}) {
    if (!Array.isArray(servers) || servers.length < 3 || servers.length % 2 === 0) {
      throw new InvalidOptionsError(
        `Redlock needs an odd number of servers, at least 3, not ${Array.isArray(servers) ? servers.length : String(servers)}`,
      );
    }
    for (const name of Object.keys(options)) {
      if (name !== "serverTimeout" && name !== "retryDelay") {
        throw new InvalidOptionsError(`unknown Redlock option '${name}' (known: serverTimeout, retryDelay)`);
      }
    }
    const positive = (name: string, value: number | undefined, fallback: number): number => {
      const v = value ?? fallback;
      if (typeof v !== "number" || !Number.isFinite(v) || v <= 0) {
        throw new InvalidOptionsError(`${name} must be a positive number of ms, not ${String(v)}`);
      }
      return v;
    };
    this.#servers = [...servers];
    this.#quorum = Math.floor(servers.length / 2) + 1;
    this.#serverTimeout = positive("serverTimeout", options.serverTimeout, 50);
    this.#retryDelay = positive("retryDelay", options.retryDelay, 100);
    this.#backend = {
      renew: async (key, owner, ttl) => {
        this.#majority(await this.#everywhere(key, cmd.renew(key, owner, ttl)));
      },
      reenter: async (key, owner, ttl) =>
        this.#majority(await this.#everywhere(key, cmd.reenter(key, owner, ttl))),
      release: async (key, owner, all) => {
        // Goes to every server; succeeds if any still held it (a minority
        // may have lost it already: their lease ended or they restarted).
        const replies = await this.#everywhere(key, cmd.release(key, owner, all));
        const left = replies.flatMap((r) => (r.ok ? [toCount(r.value)] : []));
        if (left.length > 0) {
          return Math.max(...left);
        }
        if (replies.every((r) => !r.ok && r.error instanceof LockNotHeldError)) {
          throw new LockNotHeldError();
        }
        throw new NoQuorumError(0, this.#quorum);
      },
    };
  }

  /** The majority: N / 2 + 1. */
  get quorum(): number {
    return this.#quorum;
  }

  /**
   * Rounds until a majority grants the lock, or `wait` ends
   * (`LockTimeoutError`); a random delay between rounds. `wait: 0` is one
   * round (`NoQuorumError` if it fails).
   */
  async lock(name: string, options?: LockOptions): Promise<Lock> {
    checkName(name);
    const opts = refuseEphemeral(check(options));
    if (opts.wait === 0) {
      return this.#round(name, opts);
    }
    const until = opts.wait === null ? null : performance.now() + opts.wait;
    for (;;) {
      try {
        return await this.#round(name, opts);
      } catch (err) {
        if (!(err instanceof NoQuorumError)) {
          throw err;
        }
      }
      const pause = Math.random() * this.#retryDelay;
      if (until !== null && performance.now() + pause >= until) {
        throw new LockTimeoutError("no Redlock majority before the wait ended");
      }
      await sleep(pause, opts.signal);
    }
  }

  /** One round: the lock if a majority grants it in time, else `NoQuorumError`. */
  async tryLock(name: string, options?: Omit<LockOptions, "wait">): Promise<Lock> {
    checkName(name);
    return this.#round(name, refuseEphemeral(check({ ...options, wait: 0 })));
  }

  /** Runs `fn` under the lock and releases it after; see `LockClient.using`. */
  async using<T>(
    name: string,
    options: LockOptions | undefined,
    fn: (signal: AbortSignal, lock: Lock) => Promise<T> | T,
  ): Promise<T> {
    return usingLock(() => this.lock(name, options), fn);
  }

  /** @internal Tests only. */
  set skipFenceRoundForTests(on: boolean) {
    this.#skipFenceRound = on;
  }

  async #round(name: string, opts: Checked): Promise<Lock> {
    const signal = opts.signal;
    if (signal?.aborted) {
      throw new LockAbortedError({ cause: signal.reason });
    }
    const owner = this.#owners.next();
    let onAbort: (() => void) | undefined;
    const aborted = new Promise<"aborted">((resolve) => {
      onAbort = () => resolve("aborted");
      signal?.addEventListener("abort", onAbort, { once: true });
    });
    const round = this.#acquireRound(name, owner, opts.ttl, opts);
    let outcome: Outcome<{ fence: bigint; sent: number }> | "aborted";
    try {
      outcome = await Promise.race([
        round.then(
          (value) => ({ ok: true as const, value }),
          (error: unknown) => ({ ok: false as const, error }),
        ),
        aborted,
      ]);
    } finally {
      signal?.removeEventListener("abort", onAbort as () => void);
    }
    if (outcome === "aborted") {
      // Each release goes after its acquire on the same connection, so a
      // grant still in flight is undone too.
      round.catch(() => undefined);
      this.#releaseEverywhere(name, owner).catch(() => undefined);
      throw new LockAbortedError({ cause: signal?.reason });
    }
    if (!outcome.ok) {
      await this.#releaseEverywhere(name, owner);
      throw outcome.error;
    }
    return new Lock({
      backend: this.#backend,
      key: name,
      owner,
      fence: outcome.value.fence,
      ttl: opts.ttl,
      sent: outcome.value.sent,
      watchdog: opts.watchdog,
    });
  }

  /** Acquire on all, then raise the majority to the highest fence. */
  async #acquireRound(
    key: string,
    owner: string,
    ttl: number,
    opts: Checked,
  ): Promise<{ fence: bigint; sent: number }> {
    // Measured from the send: a server may have granted right then.
    const sent = performance.now();
    const validUntil = deadline(sent, ttl);
    const replies = await this.#everywhere(key, cmd.acquire(key, owner, opts));
    const missing = replies.find((r) => !r.ok && r.error instanceof ModuleNotLoadedError);
    if (missing !== undefined && !missing.ok) {
      throw missing.error;
    }
    const granted: Array<{ index: number; fence: bigint }> = [];
    replies.forEach((r, index) => {
      if (r.ok && r.value !== null) {
        granted.push({ index, fence: toBigInt(r.value) });
      }
    });
    if (granted.length < this.#quorum || performance.now() >= validUntil) {
      throw new NoQuorumError(granted.length, this.#quorum);
    }
    const highest = granted.reduce((max, g) => (g.fence > max ? g.fence : max), 0n);
    if (!this.#skipFenceRound) {
      const raise = cmd.fence(key, owner, highest);
      const raised = await Promise.all(
        granted.map(({ index }) => this.#one(this.#servers[index] as Transport, key, raise)),
      );
      const confirmed = raised.filter((r) => r.ok && r.value !== null && toBigInt(r.value) >= highest).length;
      if (confirmed < this.#quorum) {
        throw new NoQuorumError(confirmed, this.#quorum);
      }
    }
    if (performance.now() >= validUntil) {
      throw new NoQuorumError(granted.length, this.#quorum);
    }
    return { fence: highest, sent };
  }

  async #releaseEverywhere(key: string, owner: string): Promise<void> {
    await this.#everywhere(key, cmd.release(key, owner, true));
  }

  /** Sends `args` to every server at once, each bounded by the server timeout. */
  #everywhere(key: string, args: string[]): Promise<Array<Outcome<Reply>>> {
    return Promise.all(this.#servers.map((server) => this.#one(server, key, args)));
  }

  async #one(server: Transport, key: string, args: string[]): Promise<Outcome<Reply>> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<Outcome<Reply>>((resolve) => {
      timer = setTimeout(() => resolve({ ok: false, error: new ServerTimeout() }), this.#serverTimeout);
    });
    const reply = server.call(key, args).then(
      (value): Outcome<Reply> => ({ ok: true, value }),
      (error: unknown): Outcome<Reply> => ({ ok: false, error: classify(error) }),
    );
    try {
      return await Promise.race([reply, late]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** A command that must succeed on a majority: the largest count; NOTOWNER when no majority can agree. */
  #majority(replies: Array<Outcome<Reply>>): number {
    const ok = replies.flatMap((r) => (r.ok ? [toCount(r.value)] : []));
    const refused = replies.filter((r) => !r.ok && r.error instanceof LockNotHeldError).length;
    if (ok.length >= this.#quorum) {
      return Math.max(...ok);
    }
    if (refused > this.#servers.length - this.#quorum) {
      throw new LockNotHeldError();
    }
    throw new NoQuorumError(ok.length, this.#quorum);
  }
}

/**
 * Redlock cannot keep an ephemeral hold: it would be bound to one
 * connection per server, and a majority of them closing is not something
 * any one server sees. Refused rather than quietly made an ordinary hold.
 */
function refuseEphemeral(opts: Checked): Checked {
  if (opts.ephemeral) {
    throw new LockRefusedError(
      "Redlock refuses ephemeral holds: no one connection carries a hold spread over several servers " +
        "(take an ephemeral hold with LockClient on one server)",
    );
  }
  return opts;
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(new LockAbortedError({ cause: signal.reason }));
      return;
    }
    const done = () => {
      signal?.removeEventListener("abort", stop);
      resolve();
    };
    const timer = setTimeout(done, ms);
    const stop = () => {
      clearTimeout(timer);
      reject(new LockAbortedError({ cause: signal?.reason }));
    };
    signal?.addEventListener("abort", stop, { once: true });
  });
}
