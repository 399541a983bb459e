/**
 * The adapter for ioredis: one client (`new Redis`) or a cluster
 * (`new Cluster`).
 *
 * ioredis parses integer replies for the whole connection, so the client
 * must be created with `stringNumbers: true` (a cluster: in its
 * `redisOptions`); the adapter refuses one without it rather than round
 * fences. To keep numbers elsewhere, give the locks a duplicate:
 * `ioredis(redis.duplicate({ stringNumbers: true }))`.
 */

import { type Cluster, Command, type Redis } from "ioredis";
import type { Link, RawLink, Reply, Transport } from "./transport.js";
import { LinkPool, slotOf } from "./transport.js";

/** What the adapter uses of an ioredis client. */
interface IoredisLike {
  readonly options: { stringNumbers?: boolean; host?: string; port?: number };
  call(command: string, ...args: string[]): Promise<unknown>;
  sendCommand(command: Command): unknown;
  duplicate(override?: object): IoredisLike;
  disconnect(): void;
  readonly status: string;
  readonly stream?: { ref(): void; unref(): void } | undefined;
  on(event: "error" | "connect", listener: (err: unknown) => void): unknown;
}

/** What the adapter uses of an ioredis cluster. */
interface IoredisClusterLike {
  readonly isCluster: true;
  readonly options: { redisOptions?: { stringNumbers?: boolean } };
  readonly slots: string[][];
  nodes(role?: "master" | "slave" | "all"): IoredisLike[];
  sendCommand(command: Command): unknown;
}

/** A `Transport` over an ioredis client or cluster created with `stringNumbers: true`. */
export function ioredis(redis: Redis | Cluster): Transport {
  const client = redis as unknown as IoredisLike | IoredisClusterLike;
  if (client === null || typeof client !== "object" || typeof client.sendCommand !== "function") {
    throw new TypeError("ioredis(client): pass an ioredis client (new Redis) or cluster (new Cluster)");
  }
  if ("isCluster" in client && client.isCluster) {
    if (client.options.redisOptions?.stringNumbers !== true) {
      throw new TypeError(
        "ioredis(cluster): create the cluster with { redisOptions: { stringNumbers: true } }: " +
          "fences exceed 2^53 and a Number would round them",
      );
    }
    return new ClusterTransport(client);
  }
  const one = client as IoredisLike;
  if (one.options.stringNumbers !== true) {
    throw new TypeError(
      "ioredis(client): create the client with { stringNumbers: true }, or pass " +
        "redis.duplicate({ stringNumbers: true }): fences exceed 2^53 and a Number would round them",
    );
  }
  return new ClientTransport(one);
}

function send(target: { sendCommand(command: Command): unknown }, args: readonly string[], slot?: number): Promise<Reply> {
  const command = new Command(args[0] as string, args.slice(1), { replyEncoding: "utf8" });
  if (slot !== undefined) {
    // ioredis knows the keys of the commands it ships with only; the
    // module's take their key first, and its slot routes them to the right
    // node at once (redirections are still followed).
    (command as unknown as { slot: number }).slot = slot;
  }
  target.sendCommand(command);
  return command.promise as Promise<Reply>;
}

class ClientTransport implements Transport {
  readonly #pool = new LinkPool();
  constructor(private readonly client: IoredisLike) {}

  call(_key: string, args: readonly string[]): Promise<Reply> {
    return send(this.client, args);
  }

  open(): Promise<Link> {
    return this.#pool.take("", async () => openLink(this.client));
  }
}

class ClusterTransport implements Transport {
  readonly #pool = new LinkPool();
  constructor(private readonly cluster: IoredisClusterLike) {}

  call(key: string, args: readonly string[]): Promise<Reply> {
    return send(this.cluster, args, slotOf(key));
  }

  async open(key: string, address?: string): Promise<Link> {
    const masters = this.cluster.nodes("master");
    const serving = address ?? this.cluster.slots[slotOf(key)]?.[0];
    const base =
      masters.find((node) => `${node.options.host}:${node.options.port}` === serving) ?? masters[0];
    if (base === undefined) {
      throw new Error("ioredis cluster: no master known yet (is the cluster connected?)");
    }
    const node = serving ?? `${base.options.host}:${base.options.port}`;
    return this.#pool.take(node, async () => {
      const colon = node.lastIndexOf(":");
      return openLink(base, { host: node.slice(0, colon), port: Number(node.slice(colon + 1)) });
    });
  }
}

function openLink(base: IoredisLike, where?: { host: string; port: number }): RawLink {
  const own = base.duplicate({
    ...(where ?? {}),
    stringNumbers: true,
    // One command, then closed: no reconnect that would send it twice, no
    // timeout shorter than the wait.
    retryStrategy: () => null,
    reconnectOnError: null,
    commandTimeout: undefined,
    maxRetriesPerRequest: 0,
    lazyConnect: false,
    enableOfflineQueue: true,
  });
  own.on("error", () => undefined);
  let held = true;
  // The socket exists once connecting starts; it follows the hold from then.
  own.on("connect", () => (held ? own.stream?.ref() : own.stream?.unref()));
  return {
    call: (args) => send(own, args),
    callAfter: (first, args) => {
      send(own, first).catch(() => undefined);
      return send(own, args);
    },
    destroy: () => own.disconnect(),
    alive: () => own.status === "ready" || own.status === "connect" || own.status === "connecting",
    hold: (on) => {
      held = on;
      if (on) {
        own.stream?.ref();
      } else {
        own.stream?.unref();
      }
    },
  };
}
