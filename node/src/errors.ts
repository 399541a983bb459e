/**
 * The errors a lock call throws. Each is its own class, so callers can tell
 * "lost the lock" from "someone else has it" from a bug in the call with
 * `instanceof`.
 */

/** The base of every error this package throws. */
export class LockError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * The server says this owner does not hold the lock (`-NOTOWNER`): it was
 * released, or its lease ended. Also thrown by a method of a `Lock` that was
 * released already.
 */
export class LockNotHeldError extends LockError {
  constructor(message = "the lock is not held by this owner", options?: { cause?: unknown }) {
    super(message, options);
  }
}

/** How a held lock was lost: the same names in every client of this project. */
export type LossReason =
  /** The local lease deadline passed without a renew confirming the lock. */
  | "expired"
  /**
   * The server no longer lists this owner: a renew, reentry or release was
   * answered `-NOTOWNER` (Redlock: by so many servers that no majority can
   * confirm it), or the key was overwritten by another type (`WRONGTYPE`).
   */
  | "not-owner"
  /** An ephemeral hold's own connection closed: the server ended the hold. */
  | "disconnected"
  /**
   * A release did not complete (aborted, timed out, a transport error): the
   * lock may still be held until the release, retried in the background,
   * lands or the lease ends; this handle no longer counts on it.
   */
  | "release-unconfirmed";

const LOSS_MESSAGES: Record<LossReason, string> = {
  expired: "the lock was lost: its lease ran out before a renew confirmed it",
  "not-owner": "the lock was lost: the server no longer lists this owner",
  disconnected: "the lock was lost: its ephemeral hold's connection closed",
  "release-unconfirmed": "the lock was given up: its release was not confirmed (retried in the background)",
};

/**
 * The lock was lost while held: `lock.lost` is aborted with it, `using()`
 * rejects with it when the loss happened while its callback ran, and every
 * later `renew`, `reenter` or `release` of that lock rejects with it. A lost
 * lock is not held, so this is a `LockNotHeldError`.
 */
export class LockLostError extends LockNotHeldError {
  readonly reason: LossReason;
  constructor(reason: LossReason, options?: { cause?: unknown }) {
    super(LOSS_MESSAGES[reason], options);
    this.reason = reason;
  }
}

/** `tryLock` (or `lock` with `wait: 0`): another owner holds the lock right now. */
export class WouldBlockError extends LockError {
  constructor() {
    super("the lock is held by another owner");
  }
}

/**
 * `tryLock` (or `lock` with `wait: 0`): the lock is free, but the server
 * begins no hold during its quarantine (`lock.max-ttl` after a start or a
 * promotion). Try again, or wait: the server serves waits when it ends.
 */
export class QuarantineError extends LockError {
  constructor() {
    super("the server begins no hold during its quarantine (after a start or a promotion): try again");
  }
}

/** `lock`: the wait ended before the lock was granted. */
export class LockTimeoutError extends LockError {
  constructor(message = "timed out waiting for the lock") {
    super(message);
  }
}

/** The wait was aborted by the caller's `signal`; nothing is held. */
export class LockAbortedError extends LockError {
  constructor(options?: { cause?: unknown }) {
    super("the lock call was aborted", options);
  }
}

/** The server does not know the `LOCK.*` commands: load the module. */
export class ModuleNotLoadedError extends LockError {
  constructor(options?: { cause?: unknown }) {
    super(
      "the server does not know LOCK.* commands: load the redislock module " +
        "(loadmodule /path/to/libredislock.so)",
      options,
    );
  }
}

/** Redlock: fewer servers than a majority granted (or confirmed) the lock in time. */
export class NoQuorumError extends LockError {
  readonly granted: number;
  readonly needed: number;
  constructor(granted: number, needed: number) {
    super(`no Redlock majority: ${granted} server(s) agreed, ${needed} needed`);
    this.granted = granted;
    this.needed = needed;
  }
}

/** Options refused before anything is sent, with what was wrong. */
export class InvalidOptionsError extends LockError {}

/**
 * A combination this client refuses rather than quietly weaken, such as an
 * ephemeral hold over Redlock (no one connection carries it); nothing is sent.
 */
export class LockRefusedError extends LockError {}

/**
 * A reader asked for the write side of the lock it holds shared, through the
 * same owner (one `ReadWriteLock` handle): refused at once, since two readers
 * upgrading would wait on each other for ever. Release the read side first.
 */
export class UpgradeError extends LockError {
  constructor(options?: { cause?: unknown }) {
    super("the owner holds the lock shared: release the read side before asking for the write side", options);
  }
}

/** A semaphore asked with another limit than the one the lock is shared with now. */
export class LimitMismatchError extends LockError {
  constructor(options?: { cause?: unknown }) {
    super("the lock is shared with another limit (or a request waiting on it is)", options);
  }
}

/**
 * Sorts an error from a client library into the classes callers act on;
 * anything else is returned as it is.
 */
export function classify(err: unknown): unknown {
  const message = err instanceof Error ? err.message : "";
  if (message.startsWith("NOTOWNER")) {
    return new LockNotHeldError(undefined, { cause: err });
  }
  if (message.startsWith("ERR the owner holds the lock shared")) {
    return new UpgradeError({ cause: err });
  }
  if (message.startsWith("ERR the lock is shared with another LIMIT")) {
    return new LimitMismatchError({ cause: err });
  }
  if (/^ERR unknown command/i.test(message) && /'lock\./i.test(message)) {
    return new ModuleNotLoadedError({ cause: err });
  }
  return err;
}

/**
 * Whether a renew, reentry or release error means the hold is gone: the
 * server does not list the owner (`NOTOWNER`), or the key was overwritten by
 * a value of another type (`WRONGTYPE`), which ended every hold on it.
 */
export function isGone(err: unknown): boolean {
  if (err instanceof LockNotHeldError) {
    return true;
  }
  const message = err instanceof Error ? err.message : "";
  return message.startsWith("WRONGTYPE");
}
