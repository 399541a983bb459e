/** The module's commands, as argument lists. */

import type { HoldKind } from "./options.js";

/**
 * What an acquire asks for, as checked: the lease, the kind of hold and
 * whether it is ephemeral. Taken whole, so no path can build the command
 * and leave `EPHEMERAL` out.
 */
export interface AcquireRequest {
  readonly ttl: number;
  readonly hold: HoldKind;
  readonly ephemeral: boolean;
  /** Several keys at once (`LOCK.MACQUIRE`), all or none; absent: `key` alone. */
  readonly keys?: readonly string[];
}

/**
 * `LOCK.ACQUIRE`, or `LOCK.MACQUIRE` for several keys; `waitMs` adds `WAIT`
 * (0: no time limit), absent: a single attempt.
 */
export function acquire(key: string, owner: string, req: AcquireRequest, waitMs?: number): string[] {
  const args =
    req.keys === undefined
      ? ["LOCK.ACQUIRE", key, owner, String(req.ttl)]
      : ["LOCK.MACQUIRE", String(req.keys.length), ...req.keys, owner, String(req.ttl)];
  if (req.hold.kind === "shared") {
    args.push("SHARED");
  } else if (req.hold.kind === "permit") {
    args.push("SHARED", "LIMIT", String(req.hold.limit));
    // One permit is the server's default: servers that predate PERMITS
    // keep serving single permits.
    if (req.hold.permits !== undefined && req.hold.permits !== 1) {
      args.push("PERMITS", String(req.hold.permits));
    }
  }
  if (req.ephemeral) {
    args.push("EPHEMERAL");
  }
  if (waitMs !== undefined) {
    args.push("WAIT", String(waitMs));
  }
  return args;
}

export function renew(key: string, owner: string, ttl: number): string[] {
  return ["LOCK.RENEW", key, owner, String(ttl)];
}

export function reenter(key: string, owner: string, ttl: number): string[] {
  return ["LOCK.REENTER", key, owner, String(ttl)];
}

export function release(key: string, owner: string, all: boolean): string[] {
  return all ? ["LOCK.RELEASE", key, owner, "ALL"] : ["LOCK.RELEASE", key, owner];
}

/** `LOCK.MRENEW`: every key or none. */
export function mrenew(keys: readonly string[], owner: string, ttl: number): string[] {
  return ["LOCK.MRENEW", String(keys.length), ...keys, owner, String(ttl)];
}

/** `LOCK.MRELEASE [ALL]`: every key or none. */
export function mrelease(keys: readonly string[], owner: string, all: boolean): string[] {
  const args = ["LOCK.MRELEASE", String(keys.length), ...keys, owner];
  return all ? [...args, "ALL"] : args;
}

/** The release of `key`, or of every key of a hold on several. */
export function releaseOf(key: string, owner: string, all: boolean, keys: readonly string[] | undefined): string[] {
  return keys === undefined ? release(key, owner, all) : mrelease(keys, owner, all);
}

export function fence(key: string, owner: string, minFence: bigint): string[] {
  return ["LOCK.FENCE", key, owner, minFence.toString()];
}

export function info(key: string): string[] {
  return ["LOCK.INFO", key];
}

/** Owner tokens: a random 128-bit id per client and a counter per lock call. */
export class Owners {
  readonly #id: string;
  #next = 1;
  constructor() {
    const bytes = new Uint8Array(16);
    crypto.getRandomValues(bytes);
    this.#id = Buffer.from(bytes).toString("hex");
  }
  next(): string {
    return `${this.#id}:${this.#next++}`;
  }
}
