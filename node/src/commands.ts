/** The module's commands, as argument lists. */

import type { HoldKind } from "./options.js";

export function acquire(
  key: string,
  owner: string,
  ttl: number,
  hold: HoldKind,
  waitMs?: number,
  ephemeral = false,
): string[] {
  const args = ["LOCK.ACQUIRE", key, owner, String(ttl)];
  if (hold.kind === "shared") {
    args.push("SHARED");
  } else if (hold.kind === "permit") {
    args.push("SHARED", "LIMIT", String(hold.limit));
  }
  if (ephemeral) {
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
