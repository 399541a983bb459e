/** The two client libraries, each as a way to get a `Transport` for the tests. */

import { Cluster, Redis } from "ioredis";
import { createClient, createCluster } from "redis";
import { after, before } from "node:test";
import { LockClient, type Transport } from "../src/index.js";
import { ioredis } from "../src/ioredis.js";
import { nodeRedis } from "../src/node-redis.js";
import type { Server } from "./servers.js";

export interface Connected {
  transport: Transport;
  close(): Promise<void>;
}

export interface Lib {
  name: string;
  single(server: Server): Promise<Connected>;
  cluster(nodes: Server[]): Promise<Connected>;
}

export const LIBS: Lib[] = [
  {
    name: "node-redis",
    async single(server) {
      const client = createClient({ url: server.url });
      client.on("error", () => undefined);
      await client.connect();
      return { transport: nodeRedis(client), close: async () => client.destroy() };
    },
    async cluster(nodes) {
      const cluster = createCluster({ rootNodes: nodes.map((n) => ({ url: n.url })) });
      cluster.on("error", () => undefined);
      await cluster.connect();
      return { transport: nodeRedis(cluster), close: async () => cluster.destroy() };
    },
  },
  {
    name: "ioredis",
    async single(server) {
      const client = new Redis(server.port, "127.0.0.1", { stringNumbers: true, lazyConnect: true });
      client.on("error", () => undefined);
      await client.connect();
      return { transport: ioredis(client), close: async () => client.disconnect() };
    },
    async cluster(nodes) {
      const cluster = new Cluster(
        nodes.map((n) => ({ host: "127.0.0.1", port: n.port })),
        { redisOptions: { stringNumbers: true }, lazyConnect: true },
      );
      cluster.on("error", () => undefined);
      await cluster.connect();
      return { transport: ioredis(cluster), close: async () => cluster.disconnect() };
    },
  },
];

/**
 * Inside a `describe`: a `LockClient` connected by `connect` before the
 * suite's tests and closed after them. The value returned stands for it.
 */
export function connectedClient(connect: () => Promise<Connected>): LockClient {
  let real: LockClient | undefined;
  let conn: Connected | undefined;
  before(async () => {
    conn = await connect();
    real = new LockClient(conn.transport);
  });
  after(async () => {
    real?.close();
    await conn?.close();
  });
  return new Proxy({} as LockClient, {
    get(_target, prop) {
      if (real === undefined) {
        throw new Error("the client is connected in the suite's before hook");
      }
      const value: unknown = Reflect.get(real, prop, real);
      return typeof value === "function" ? value.bind(real) : value;
    },
  });
}
