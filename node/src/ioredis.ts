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
import { LinkPool, redirection, slotOf } from "./transport.js";

/** What the adapter uses of an ioredis client. */
interface IoredisLike {
  readonly options: { stringNumbers?: boolean; host?: string; port?: number };
  call(command: string, ...args: string[]): Promise<unknown>;
  sendCommand(command: Command): unknown;
  duplicate(override?: object): IoredisLike;
  disconnect(): void;
  readonly status: string;
  readonly stream?: { ref(): void; unref(): void } | undefined;
  on(event: "error" | "connect" | "end", listener: (err: unknown) => void): unknown;
}

/** What the adapter uses of an ioredis cluster. */
interface IoredisClusterLike {
  readonly isCluster: true;
  readonly options: { redisOptions?: { stringNumbers?: boolean } };
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

  close(): void {
    this.#pool.clear();
  }
  constructor(private readonly client: IoredisLike) {}

  call(_key: string, args: readonly string[]): Promise<Reply> {
    return send(this.client, args);
  }

  open(): Promise<Link> {
    return this.#pool.take("", async () => openLink(this.client));
  }
}

/** How many `MOVED`/`ASK` one command follows before it gives up. */
const MAX_REDIRECTS = 5;

/**
 * Routes each command to the master serving its key, by a slot map of its
 * own. ioredis's map cannot serve here: a cluster whose connections hand
 * integers back as strings reads the slot ranges of `CLUSTER SLOTS` as
 * strings too, and compares them as strings (6.0.0: "5461" <= "10922" is
 * false), so whole ranges are missing from it and their commands go to a
 * random node and bounce with `MOVED`, each bounce refreshing the map over a
 * new connection. The commands still go through the cluster's own node
 * connections.
 */
class ClusterTransport implements Transport {
  readonly #pool = new LinkPool();

  close(): void {
    this.#pool.clear();
  }
  /** `host:port` of each slot's master; filled from `CLUSTER SLOTS`. */
  #slots: Array<string | undefined> = new Array<string | undefined>(16384);
  #loading: Promise<void> | null = null;
  constructor(private readonly cluster: IoredisClusterLike) {}

  async call(key: string, args: readonly string[]): Promise<Reply> {
    const slot = slotOf(key);
    let address = await this.#serving(slot);
    let ask = false;
    for (let hop = 0; ; hop++) {
      const node = address === undefined ? undefined : this.#node(address);
      if (node === undefined) {
        // A node the cluster client has no connection to: let it route.
        return send(this.cluster, args, slot);
      }
      try {
        if (ask) {
          // Sent together, on the same connection, nothing between them.
          send(node, ["ASKING"]).catch(() => undefined);
        }
        return await send(node, args);
      } catch (err) {
        const moved = redirection(err);
        if (moved === null || hop >= MAX_REDIRECTS) {
          throw err;
        }
        if (!moved.ask) {
          this.#slots[slot] = moved.address;
          this.#refresh().catch(() => undefined);
        }
        address = moved.address;
        ask = moved.ask;
      }
    }
  }

  async open(key: string, address?: string): Promise<Link> {
    const serving = address ?? (await this.#serving(slotOf(key)));
    const base = (serving === undefined ? undefined : this.#node(serving)) ?? this.cluster.nodes("master")[0];
    if (base === undefined) {
      throw new Error("ioredis cluster: no master known yet (is the cluster connected?)");
    }
    const node = serving ?? `${base.options.host}:${base.options.port}`;
    return this.#pool.take(node, async () => {
      const colon = node.lastIndexOf(":");
      return openLink(base, { host: node.slice(0, colon), port: Number(node.slice(colon + 1)) });
    });
  }

  async #serving(slot: number): Promise<string | undefined> {
    if (this.#slots[slot] === undefined) {
      await this.#refresh();
    }
    return this.#slots[slot];
  }

  #node(address: string): IoredisLike | undefined {
    return this.cluster
      .nodes("all")
      .find((node) => `${node.options.host}:${node.options.port}` === address);
  }

  /** Reads `CLUSTER SLOTS` from a master; one read at a time. */
  #refresh(): Promise<void> {
    this.#loading ??= (async () => {
      try {
        for (const node of this.cluster.nodes("master")) {
          let reply: Reply;
          try {
            reply = await send(node, ["CLUSTER", "SLOTS"]);
          } catch {
            continue;
          }
          const slots = new Array<string | undefined>(16384);
          for (const range of Array.isArray(reply) ? reply : []) {
            if (!Array.isArray(range) || !Array.isArray(range[2])) {
              continue;
            }
            const [first, last, master] = [Number(range[0]), Number(range[1]), range[2]];
            const address = `${String(master[0])}:${String(master[1])}`;
            for (let slot = first; slot <= last; slot++) {
              slots[slot] = address;
            }
          }
          this.#slots = slots;
          return;
        }
      } finally {
        this.#loading = null;
      }
    })();
    return this.#loading;
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
  // Queued ahead of the link's first command, answered before it.
  const id = send(own, ["CLIENT", "ID"]).then(
    (reply) => (typeof reply === "string" ? reply : null),
    () => null,
  );
  return {
    id,
    call: (args) => send(own, args),
    callAfter: (first, args) => {
      send(own, first).catch(() => undefined);
      return send(own, args);
    },
    destroy: () => own.disconnect(),
    onEnd: (listener) => void own.on("end", listener),
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
