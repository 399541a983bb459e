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
  /**
   * The server's id of this connection (`CLIENT ID`), or null if it could
   * not be read: `CLIENT UNBLOCK` takes a parked command out of the queue
   * from another connection, so the link itself can still release a grant
   * that crossed the cancel before it is closed.
   */
  readonly id: Promise<string | null>;
  /** Sends one command; resolves with its reply. */
  call(args: readonly string[]): Promise<Reply>;
  /** Sends several commands at once (`ASKING` and the command after it); the last reply. */
  callAfter(first: readonly string[], args: readonly string[]): Promise<Reply>;
  /** Closes the connection now, without waiting for pending replies. */
  close(): void;
  /** Calls `listener` once if the connection closes other than by `close()`. */
  onClose(listener: () => void): void;
  /**
   * The last command has its reply and nothing is pending: the link may
   * serve another wait (kept idle, not keeping the process alive).
   */
  recycle(): void;
}

/** A connection as an adapter makes it, before pooling. */
export interface RawLink {
  /** `CLIENT ID` of the connection, read once when it is opened. */
  readonly id: Promise<string | null>;
  call(args: readonly string[]): Promise<Reply>;
  callAfter(first: readonly string[], args: readonly string[]): Promise<Reply>;
  destroy(): void;
  /** Still connected and usable. */
  alive(): boolean;
  /** Whether the connection keeps the process alive: while a wait runs, yes; idle, no. */
  hold(on: boolean): void;
  /** Calls `listener` when the connection has closed, for whatever reason. */
  onEnd(listener: () => void): void;
}

/** Idle links kept per node. */
const IDLE_PER_NODE = 64;

/**
 * Connections for waits, kept per node for the next wait once their
 * command has answered: opening one per wait costs more round trips (the
 * connect, the handshake) than the wait itself when the lock is busy.
 */
export class LinkPool {
  readonly #idle = new Map<string, RawLink[]>();

  /** An idle link to `node` if one is still connected, else a new one from `open`. */
  async take(node: string, open: () => Promise<RawLink>): Promise<Link> {
    const idle = this.#idle.get(node);
    let raw: RawLink | undefined;
    while (idle !== undefined && (raw = idle.pop()) !== undefined) {
      if (raw.alive()) {
        break;
      }
      raw.destroy();
      raw = undefined;
    }
    raw ??= await open();
    raw.hold(true);
    return this.#wrap(node, raw);
  }

  #wrap(node: string, raw: RawLink): Link {
    let done = false;
    return {
      id: raw.id,
      call: (args) => raw.call(args),
      callAfter: (first, args) => raw.callAfter(first, args),
      close: () => {
        if (!done) {
          done = true;
          raw.destroy();
        }
      },
      onClose: (listener) => {
        let called = false;
        raw.onEnd(() => {
          if (!done && !called) {
            called = true;
            listener();
          }
        });
      },
      recycle: () => {
        if (done) {
          return;
        }
        done = true;
        const idle = this.#idle.get(node) ?? [];
        if (idle.length >= IDLE_PER_NODE || !raw.alive()) {
          raw.destroy();
          return;
        }
        raw.hold(false);
        idle.push(raw);
        this.#idle.set(node, idle);
      },
    };
  }

  /** Closes every idle link. */
  clear(): void {
    for (const idle of this.#idle.values()) {
      for (const raw of idle) {
        raw.destroy();
      }
    }
    this.#idle.clear();
  }
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
  /** Closes the idle connections kept for waits (not the client library's own). */
  close?(): void;
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
