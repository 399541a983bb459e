/**
 * The options of a lock call, checked before anything is sent, and the
 * timing rules derived from them (the same as the Rust client's).
 */

import { InvalidOptionsError } from "./errors.js";

/** The server's bound on `ttl-ms` and `timeout-ms`: 2^40 ms. */
export const MAX_MS = 2 ** 40;

/** Options of one lock call. Every field is optional. */
export interface LockOptions {
  /** The lease in ms, 1 to 2^40 (default 30 000). The watchdog renews it. */
  ttl?: number;
  /**
   * How long `lock` waits for the lock, in ms (default 30 000). `0`: one
   * attempt, `WouldBlockError` if it is held. `Infinity`: no time limit.
   * The server queues waiters first come, first served.
   */
  wait?: number;
  /**
   * Renew the lease every third of the ttl while the lock is held (default
   * true). Off, the lease is renewed only by `renew()`, and `lost` fires at
   * the local deadline.
   */
  watchdog?: boolean;
  /** Aborts a wait: the waiter leaves the queue and nothing stays held. */
  signal?: AbortSignal;
  /**
   * An ephemeral hold (default false): taken on a connection of its own,
   * kept open for the hold's life; the server ends the hold the moment that
   * connection closes (a crashed process frees the lock at once, not at
   * its lease end), and `lost` fires with reason `"disconnected"`.
   */
  ephemeral?: boolean;
}

/**
 * What a lock call asks the server for: the lock alone (a mutex, or a
 * read-write lock's write side), a shared hold (the read side), or one of
 * `limit` permits of a semaphore. Each kind adds its words to the acquire
 * command.
 */
export type HoldKind =
  | { readonly kind: "exclusive" }
  | { readonly kind: "shared" }
  | { readonly kind: "permit"; readonly limit: number; readonly permits?: number };

export const EXCLUSIVE: HoldKind = { kind: "exclusive" };
export const SHARED: HoldKind = { kind: "shared" };

/** The most permits a semaphore may have (the server's bound). */
export const MAX_PERMITS = 1_000_000;

/** A semaphore's permit kind, its limit checked. */
export function permits(limit: unknown): HoldKind {
  if (typeof limit !== "number" || !Number.isInteger(limit) || limit < 1 || limit > MAX_PERMITS) {
    throw new InvalidOptionsError(
      `a semaphore's limit must be a whole number from 1 to ${MAX_PERMITS}, not ${String(limit)}`,
    );
  }
  return { kind: "permit", limit };
}

/** A lock call's options once checked: whole ms, defaults filled in. */
export interface Checked {
  readonly ttl: number;
  /** `null`: no time limit. */
  readonly wait: number | null;
  readonly watchdog: boolean;
  readonly signal: AbortSignal | undefined;
  readonly hold: HoldKind;
  readonly ephemeral: boolean;
  /** Several keys taken at once (`LOCK.MACQUIRE`); absent: the one key named. */
  readonly keys?: readonly string[];
}

const KNOWN = new Set(["ttl", "wait", "watchdog", "signal", "ephemeral"]);

/** Checks `opts`; throws `InvalidOptionsError` naming the first bad field. */
export function check(opts: LockOptions | undefined, hold: HoldKind = EXCLUSIVE): Checked {
  if (opts === undefined || opts === null) {
    opts = {};
  }
  if (typeof opts !== "object") {
    throw new InvalidOptionsError(`options must be an object, not ${typeof opts}`);
  }
  for (const name of Object.keys(opts)) {
    if (!KNOWN.has(name)) {
      throw new InvalidOptionsError(
        `unknown option '${name}' (known: ${[...KNOWN].join(", ")})`,
      );
    }
  }
  const ttl = checkTtl(opts.ttl ?? 30_000);
  const wait = opts.wait ?? 30_000;
  if (
    typeof wait !== "number" ||
    Number.isNaN(wait) ||
    wait < 0 ||
    (wait !== Infinity && (!Number.isInteger(wait) || wait > MAX_MS))
  ) {
    throw new InvalidOptionsError(
      `wait must be a whole number of ms from 0 to 2^40, or Infinity, not ${String(wait)}`,
    );
  }
  const watchdog = opts.watchdog ?? true;
  if (typeof watchdog !== "boolean") {
    throw new InvalidOptionsError(`watchdog must be true or false, not ${String(watchdog)}`);
  }
  const signal = opts.signal;
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    throw new InvalidOptionsError("signal must be an AbortSignal");
  }
  const ephemeral = opts.ephemeral ?? false;
  if (typeof ephemeral !== "boolean") {
    throw new InvalidOptionsError(`ephemeral must be true or false, not ${String(ephemeral)}`);
  }
  return { ttl, wait: wait === Infinity ? null : wait, watchdog, signal, hold, ephemeral };
}

/** A lease in ms, checked: a whole number from 1 to 2^40. */
export function checkTtl(ttl: unknown): number {
  if (typeof ttl !== "number" || !Number.isInteger(ttl) || ttl < 1 || ttl > MAX_MS) {
    throw new InvalidOptionsError(`ttl must be a whole number of ms from 1 to 2^40, not ${String(ttl)}`);
  }
  return ttl;
}

/** Options of `Lock.release` and `releaseAll`. */
export interface ReleaseOptions {
  /**
   * Gives up waiting for the server's answer: the call rejects with
   * `LockAbortedError`, the lock is reported lost (`"release-unconfirmed"`)
   * and the release is retried in the background until it lands or the
   * lease ends.
   */
  signal?: AbortSignal;
}

/** Checks the options of a release. */
export function checkReleaseOptions(opts: ReleaseOptions | undefined): ReleaseOptions {
  if (opts === undefined || opts === null) {
    return {};
  }
  if (typeof opts !== "object") {
    throw new InvalidOptionsError(`release options must be an object, not ${typeof opts}`);
  }
  for (const name of Object.keys(opts)) {
    if (name !== "signal") {
      throw new InvalidOptionsError(`unknown release option '${name}' (known: signal)`);
    }
  }
  if (opts.signal !== undefined && !(opts.signal instanceof AbortSignal)) {
    throw new InvalidOptionsError("signal must be an AbortSignal");
  }
  return opts;
}

/**
 * Clock drift allowed for a lease: 1 % of the ttl plus 2 ms (the Redlock
 * design's figure). The local deadline is `send time + ttl − drift`, so the
 * client gives the lock up before any server can have let it go.
 */
export function drift(ttl: number): number {
  return ttl / 100 + 2;
}

/** Until when a lease of `ttl` sent at `sent` (ms, `performance.now()`) is surely valid. */
export function deadline(sent: number, ttl: number): number {
  return sent + Math.max(0, ttl - drift(ttl));
}

/** The watchdog renews every third of the lease, so two renews can fail before it ends. */
export function renewPeriod(ttl: number): number {
  return Math.max(1, ttl / 3);
}

/** How soon the watchdog tries again after a renew that failed in transit. */
export function retryPeriod(ttl: number): number {
  return Math.min(500, Math.max(5, ttl / 30));
}
