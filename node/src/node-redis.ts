/**
 * The adapter for node-redis (`redis`, v5 and later): one client
 * (`createClient`) or a cluster (`createCluster`), connected.
 *
 * Integers come back as strings through node-redis's RESP type mapping,
 * per command: the client's own replies elsewhere are unchanged.
 */

import type { RedisClientType } from "redis";
import type { Link, RawLink, Reply, Transport } from "./transport.js";
import { LinkPool, slotOf } from "./transport.js";

/** RESP type bytes (the protocol's): their replies as JavaScript strings. */
const AS_STRINGS = {
  58: String, // ':' integer
  40: String, // '(' big number
  36: String, // '$' bulk string
  43: String, // '+' simple string
  61: String, // '=' verbatim string
} as const;
const OPTIONS = { typeMapping: AS_STRINGS };

/** What the adapter uses of a node-redis client. */
interface NodeRedisClientLike {
  sendCommand(args: readonly string[], options?: object): Promise<unknown>;
  duplicate(overrides?: object): NodeRedisClientLike;
  connect(): Promise<unknown>;
  destroy(): void;
  ref(): void;
  unref(): void;
  readonly isReady: boolean;
  on(event: "error" | "end", listener: (err: unknown) => void): unknown;
  readonly options?: { socket?: { host?: string; port?: number } } | undefined;
}

/** What the adapter uses of a node-redis cluster. */
interface NodeRedisClusterLike {
  sendCommand(
    firstKey: string | undefined,
    isReadonly: boolean | undefined,
    args: readonly string[],
    options?: object,
  ): Promise<unknown>;
  getSlotMaster(slot: number): { host: string; port: number };
  nodeClient(node: never): Promise<unknown>;
}

/** Any node-redis client or cluster, whatever its modules, scripts, RESP version and type mapping. */
export type NodeRedisClient =
  | RedisClientType<any, any, any, any, any>
  // A cluster's generics do not widen to `any` (its methods take its own
  // client type): what the adapter uses of it.
  | { sendCommand(...args: any[]): Promise<unknown>; getSlotMaster(slot: number): unknown; nodeClient(node: any): Promise<unknown> };

/** A `Transport` over a connected node-redis client or cluster. */
export function nodeRedis(redis: NodeRedisClient): Transport {
  const client = redis as unknown as NodeRedisClientLike | NodeRedisClusterLike;
  if (client === null || typeof client !== "object" || typeof client.sendCommand !== "function") {
    throw new TypeError("nodeRedis(client): pass a node-redis client (createClient) or cluster (createCluster)");
  }
  if ("getSlotMaster" in client && typeof client.getSlotMaster === "function") {
    return new ClusterTransport(client);
  }
  return new ClientTransport(client as NodeRedisClientLike);
}

class ClientTransport implements Transport {
  readonly #pool = new LinkPool();

  close(): void {
    this.#pool.clear();
  }
  constructor(private readonly client: NodeRedisClientLike) {}

  call(_key: string, args: readonly string[]): Promise<Reply> {
    return this.client.sendCommand(args, OPTIONS) as Promise<Reply>;
  }

  open(): Promise<Link> {
    return this.#pool.take("", () => openLink(this.client));
  }
}

class ClusterTransport implements Transport {
  readonly #pool = new LinkPool();

  close(): void {
    this.#pool.clear();
  }
  constructor(private readonly cluster: NodeRedisClusterLike) {}

  call(key: string, args: readonly string[]): Promise<Reply> {
    return this.cluster.sendCommand(key, false, args, OPTIONS) as Promise<Reply>;
  }

  async open(key: string, address?: string): Promise<Link> {
    const master = this.cluster.getSlotMaster(slotOf(key));
    // A connection to the slot's master carries the cluster's connection
    // options (TLS, credentials); a redirection only changes where it goes.
    const node = address ?? `${master.host}:${master.port}`;
    return this.#pool.take(node, async () => {
      const base = (await this.cluster.nodeClient(master as never)) as NodeRedisClientLike;
      const colon = node.lastIndexOf(":");
      return openLink(base, { host: node.slice(0, colon), port: Number(node.slice(colon + 1)) });
    });
  }
}

async function openLink(base: NodeRedisClientLike, where?: { host: string; port: number }): Promise<RawLink> {
  const socket = { ...(base.options?.socket ?? {}), ...(where ?? {}), reconnectStrategy: false };
  const own = base.duplicate({ socket });
  // A dropped link fails its pending command; it must not crash the process.
  own.on("error", () => undefined);
  await own.connect();
  const id = (own.sendCommand(["CLIENT", "ID"], OPTIONS) as Promise<Reply>).then(
    (reply) => (typeof reply === "string" ? reply : null),
    () => null,
  );
  return {
    id,
    call: (args) => own.sendCommand(args, OPTIONS) as Promise<Reply>,
    callAfter: (first, args) => {
      const before = own.sendCommand(first, OPTIONS);
      before.catch(() => undefined);
      return own.sendCommand(args, OPTIONS) as Promise<Reply>;
    },
    destroy: () => own.destroy(),
    alive: () => own.isReady,
    hold: (on) => (on ? own.ref() : own.unref()),
    // With no reconnect, a dropped socket surfaces as an error, not always
    // as "end"; either means the connection is gone.
    onEnd: (listener) => {
      own.on("end", listener);
      own.on("error", () => {
        if (!own.isReady) {
          listener();
        }
      });
    },
  };
}
