/**
 * What the lock code needs from a Redis client library, and the reply
 * helpers. The adapters (`redislock-client/node-redis`,
 * `redislock-client/ioredis`) implement `Transport` for one server or one
 * cluster of each library.
 *
 * Integer replies must arrive as decimal strings: fences are near 2^61, and
 * a JavaScript `Number` rounds them to a multiple of 256.
 */

/**
 * A reply as the adapters hand it over: integers and bulk strings as
 * strings, nil as null, arrays (or a RESP3 map, as a Map or an object).
 */
export type Reply = string | null | Reply[] | Map<string, Reply> | { [field: string]: Reply };

/** A connection of its own, for one blocking command. */
export interface Link {
  /** Sends one command; resolves with its reply. */
  call(args: readonly string[]): Promise<Reply>;
  /** Sends several commands at once (`ASKING` and the command after it); the last reply. */
  callAfter(first: readonly string[], args: readonly string[]): Promise<Reply>;
  /** Closes the connection now, without waiting for pending replies. */
  close(): void;
}

/** A server, or a cluster, as the lock code sees it. */
export interface Transport {
  /**
   * Sends a command about `key` on the shared connection; a cluster routes it
   * to the node serving `key` and follows its redirections.
   */
  call(key: string, args: readonly string[]): Promise<Reply>;
  /**
   * Opens a connection of its own to the node serving `key` (one server: to
   * it), or to `address` (`host:port`) when a redirection named one.
   */
  open(key: string, address?: string): Promise<Link>;
}

/** A fence (or any integer reply) as a bigint, never through `Number`. */
export function toBigInt(reply: Reply): bigint {
  if (typeof reply === "string" && /^-?\d+$/.test(reply)) {
    return BigInt(reply);
  }
  throw new TypeError(`expected an integer reply as a string, got ${describe(reply)}`);
}

/** A count (reentrancy, remaining holds): small, so a `number`. */
export function toCount(reply: Reply): number {
  const n = toBigInt(reply);
  return n <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(n) : Number.MAX_SAFE_INTEGER;
}

function describe(reply: Reply): string {
  if (typeof reply === "number") {
    return `the number ${reply} (the adapter must hand integers back as strings)`;
  }
  return JSON.stringify(reply) ?? String(reply);
}

/** The fields of `LOCK.INFO`, from a RESP2 flat array or a RESP3 map. */
export function infoFields(reply: Reply): Map<string, Reply> | null {
  if (reply === null) {
    return null;
  }
  if (reply instanceof Map) {
    return reply;
  }
  const fields = new Map<string, Reply>();
  if (Array.isArray(reply)) {
    for (let i = 0; i + 1 < reply.length; i += 2) {
      fields.set(String(reply[i]), reply[i + 1] as Reply);
    }
  } else if (typeof reply === "object") {
    for (const [name, value] of Object.entries(reply)) {
      fields.set(name, value);
    }
  }
  return fields;
}

/** A `-MOVED slot host:port` or `-ASK slot host:port` error, parsed. */
export function redirection(err: unknown): { ask: boolean; address: string } | null {
  const message = err instanceof Error ? err.message : "";
  const found = /^(MOVED|ASK) \d+ (\S+)/.exec(message);
  return found ? { ask: found[1] === "ASK", address: found[2] as string } : null;
}

/** The cluster slot of a key (CRC16/XMODEM of its hash tag, mod 16384). */
export function slotOf(key: string): number {
  let bytes = Buffer.from(key);
  const open = bytes.indexOf(0x7b); // {
  if (open >= 0) {
    const close = bytes.indexOf(0x7d, open + 1); // }
    if (close > open + 1) {
      bytes = bytes.subarray(open + 1, close);
    }
  }
  let crc = 0;
  for (const byte of bytes) {
    crc ^= byte << 8;
    for (let bit = 0; bit < 8; bit++) {
      crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
    }
  }
  return crc % 16384;
}
