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

/** How a held lock was lost. */
export type LossReason =
  /** A renew was answered `-NOTOWNER` (Redlock: by so many servers that no majority can confirm it). */
  | "notowner"
  /** The local lease deadline passed without a renew confirming the lock. */
  | "expired"
  /** An ephemeral hold's own connection closed: the server ended the hold. */
  | "disconnected";

/**
 * The lock was lost while held: `lock.lost` is aborted with it, and `using()`
 * rejects with it when the loss happened while its callback ran.
 */
export class LockLostError extends LockError {
  readonly reason: LossReason;
  constructor(reason: LossReason, options?: { cause?: unknown }) {
    super(
      reason === "notowner"
        ? "the lock was lost: the server no longer lists this owner"
        : reason === "disconnected"
          ? "the lock was lost: its ephemeral hold's connection closed"
          : "the lock was lost: its lease ran out before a renew confirmed it",
      options,
    );
    this.reason = reason;
  }
}

/** `tryLock` (or `lock` with `wait: 0`): another owner holds the lock right now. */
export class WouldBlockError extends LockError {
  constructor() {
    super("the lock is held by another owner");
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
 * Sorts an error from a client library into the classes callers act on;
 * anything else is returned as it is.
 */
export function classify(err: unknown): unknown {
  const message = err instanceof Error ? err.message : "";
  if (message.startsWith("NOTOWNER")) {
    return new LockNotHeldError(undefined, { cause: err });
  }
  if (/^ERR unknown command/i.test(message) && /'lock\./i.test(message)) {
    return new ModuleNotLoadedError({ cause: err });
  }
  return err;
}
