/**
 * Node locks compared on the same servers (started here, with the module):
 * this client (through node-redis and through ioredis) against `redlock`
 * 4.x and `redis-semaphore`'s Mutex and Semaphore, over ioredis.
 *
 * - uncontended: one caller, lock then unlock, again and again;
 * - contended: 32 workers in one process on one lock, each taking it,
 *   releasing it at once and asking again: acquisitions/s, the wait of each
 *   acquisition (p50, p99), and fairness (acquisitions per worker: min, max,
 *   Jain's index, 1 = perfectly even);
 * - a semaphore of 8 permits, 32 workers (as contended, each holding a permit);
 * - Redlock over 3 servers, uncontended.
 *
 * Each figure is the median of `BENCH_REPEAT` runs (default 3) of
 * `BENCH_SECONDS` each (default 2), the libraries taking turns in a rotating
 * order within each repetition.
 */

import { Redis } from "ioredis";
import { createClient } from "redis";
import Redlock4 from "redlock";
import { Mutex, RedlockMutex, Semaphore as RsSemaphore } from "redis-semaphore";
import { LockClient, Redlock } from "../src/index.js";
import { ioredis } from "../src/ioredis.js";
import { nodeRedis } from "../src/node-redis.js";
import { Server } from "../test/servers.js";

const SECONDS = Number(process.env.BENCH_SECONDS ?? 2);
const REPEAT = Number(process.env.BENCH_REPEAT ?? 3);

/** Runs each subject REPEAT times, rotating the order; the median of each field. */
async function rounds<S, R extends Record<string, number>>(
  subjects: Array<[string, S]>,
  measure: (subject: S) => Promise<R>,
): Promise<Array<[string, R]>> {
  const results = subjects.map(() => [] as R[]);
  for (let rep = 0; rep < REPEAT; rep++) {
    for (let k = 0; k < subjects.length; k++) {
      const i = (k + rep) % subjects.length;
      results[i]!.push(await measure(subjects[i]![1]));
    }
  }
  return subjects.map(([name], i) => {
    const runs = results[i]!;
    const median = {} as Record<string, number>;
    for (const field of Object.keys(runs[0]!)) {
      const values = runs.map((r) => r[field]!).sort((a, b) => a - b);
      median[field] = values[Math.floor(values.length / 2)]!;
    }
    return [name, median as R];
  });
}
const WORKERS = 32;
/** Permits of the semaphore section. */
const PERMITS = 8;

/** Lock then unlock once; resolves when both are done. */
type Cycle = () => Promise<void>;
/** What one worker does to take and give back the lock. */
type Taker = () => Promise<() => Promise<void>>;

function quantile(sorted: number[], q: number): number {
  if (sorted.length === 0) {
    return NaN;
  }
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
}

async function uncontended(cycle: Cycle): Promise<{ rate: number; p50: number; p99: number }> {
  for (let i = 0; i < 200; i++) {
    await cycle();
  }
  const times: number[] = [];
  const end = performance.now() + SECONDS * 1000;
  while (performance.now() < end) {
    const t = performance.now();
    await cycle();
    times.push(performance.now() - t);
  }
  times.sort((a, b) => a - b);
  return { rate: times.length / SECONDS, p50: quantile(times, 0.5), p99: quantile(times, 0.99) };
}

async function contended(
  take: Taker,
): Promise<{ rate: number; p50: number; p99: number; min: number; max: number; jain: number; errors: number }> {
  const counts = new Array<number>(WORKERS).fill(0);
  const waits: number[] = [];
  let errors = 0;
  let stop = false;
  const end = performance.now() + SECONDS * 1000;
  const workers = counts.map(async (_, w) => {
    while (!stop) {
      const t = performance.now();
      let release: () => Promise<void>;
      try {
        release = await take();
      } catch {
        errors++;
        continue;
      }
      waits.push(performance.now() - t);
      counts[w]!++;
      await release();
    }
  });
  await new Promise((r) => setTimeout(r, end - performance.now()));
  stop = true;
  await Promise.all(workers);
  const total = counts.reduce((a, b) => a + b, 0);
  const squares = counts.reduce((a, b) => a + b * b, 0);
  waits.sort((a, b) => a - b);
  return {
    rate: total / SECONDS,
    p50: quantile(waits, 0.5),
    p99: quantile(waits, 0.99),
    min: Math.min(...counts),
    max: Math.max(...counts),
    jain: squares === 0 ? 0 : (total * total) / (WORKERS * squares),
    errors,
  };
}

const ms = (x: number) => (x < 10 ? x.toFixed(2) : x.toFixed(0));

async function main(): Promise<void> {
  const servers = await Promise.all([0, 1, 2].map(() => Server.start()));
  const [one] = servers as [Server, Server, Server];
  const clients: Array<{ close(): void }> = [];
  const nr = async (s: Server) => {
    const c = createClient({ url: s.url });
    await c.connect();
    clients.push({ close: () => c.destroy() });
    return c;
  };
  const io = (s: Server, stringNumbers: boolean) => {
    const c = new Redis(s.port, "127.0.0.1", { stringNumbers });
    clients.push({ close: () => c.disconnect() });
    return c;
  };
  let n = 0;
  const fresh = (what: string) => `bench:${what}:${n++}`;

  console.log(
    `# Node locks: median of ${REPEAT} runs of ${SECONDS} s, ${process.env.LOCK_SERVER || "redis-server"}, Node ${process.version}\n`,
  );
  console.log("## Uncontended lock + unlock, one caller, one server\n");
  console.log("| library | cycles/s | p50 ms | p99 ms |\n|---|---|---|---|");
  const ours = [
    { name: "redislock-client (node-redis)", locks: new LockClient(nodeRedis(await nr(one))) },
    { name: "redislock-client (ioredis)", locks: new LockClient(ioredis(io(one, true))) },
  ];
  const single: Array<[string, Cycle]> = [];
  for (const { name, locks } of ours) {
    const key = fresh("u");
    single.push([
      name,
      async () => {
        const lock = await locks.lock(key, { ttl: 10_000 });
        await lock.release();
      },
    ]);
  }
  const rl4 = new Redlock4([io(one, false)], { retryCount: -1, retryDelay: 10, retryJitter: 5 });
  const rlKey = fresh("u");
  single.push([
    "redlock 4.2.0 (ioredis)",
    async () => {
      const lock = await rl4.lock(rlKey, 10_000);
      await lock.unlock();
    },
  ]);
  const semClient = io(one, false);
  const semKey = fresh("u");
  single.push([
    "redis-semaphore 5.8.0 Mutex (ioredis)",
    async () => {
      const mutex = new Mutex(semClient, semKey, { lockTimeout: 10_000, acquireTimeout: 10_000, retryInterval: 10 });
      await mutex.acquire();
      await mutex.release();
    },
  ]);
  for (const [name, r] of await rounds(single, uncontended)) {
    console.log(`| ${name} | ${r.rate.toFixed(0)} | ${ms(r.p50)} | ${ms(r.p99)} |`);
  }

  console.log(`\n## ${WORKERS} workers on one lock, one server\n`);
  console.log(
    "| library | acquisitions/s | wait p50 ms | wait p99 ms | per worker min / max | Jain | errors |\n|---|---|---|---|---|---|---|",
  );
  const takers: Array<[string, Taker]> = [];
  for (const { name, locks } of ours) {
    const key = fresh("c");
    takers.push([
      name,
      async () => {
        const lock = await locks.lock(key, { ttl: 10_000, wait: 30_000 });
        return async () => void (await lock.release());
      },
    ]);
  }
  const rlc = fresh("c");
  takers.push([
    "redlock 4.2.0 (ioredis), retry every 10 ± 5 ms",
    async () => {
      const lock = await rl4.lock(rlc, 10_000);
      return async () => void (await lock.unlock());
    },
  ]);
  const semc = fresh("c");
  takers.push([
    "redis-semaphore 5.8.0 Mutex (ioredis), retry every 10 ms",
    async () => {
      const mutex = new Mutex(semClient, semc, { lockTimeout: 10_000, acquireTimeout: 30_000, retryInterval: 10 });
      await mutex.acquire();
      return async () => void (await mutex.release());
    },
  ]);
  for (const [name, r] of await rounds(takers, contended)) {
    console.log(
      `| ${name} | ${r.rate.toFixed(0)} | ${ms(r.p50)} | ${ms(r.p99)} | ${r.min} / ${r.max} | ${r.jain.toFixed(3)} | ${r.errors} |`,
    );
  }

  console.log(`\n## A semaphore of ${PERMITS} permits, ${WORKERS} workers, one server\n`);
  console.log(
    "| library | acquisitions/s | wait p50 ms | wait p99 ms | per worker min / max | Jain | errors |\n|---|---|---|---|---|---|---|",
  );
  const permitTakers: Array<[string, Taker]> = [];
  for (const { name, locks } of ours) {
    const pool = locks.semaphore(fresh("s"), PERMITS);
    permitTakers.push([
      name,
      async () => {
        const permit = await pool.acquire({ ttl: 10_000, wait: 30_000 });
        return async () => void (await permit.release());
      },
    ]);
  }
  const rss = fresh("s");
  permitTakers.push([
    "redis-semaphore 5.8.0 Semaphore (ioredis), retry every 10 ms",
    async () => {
      const sem = new RsSemaphore(semClient, rss, PERMITS, {
        lockTimeout: 10_000,
        acquireTimeout: 30_000,
        retryInterval: 10,
      });
      await sem.acquire();
      return async () => void (await sem.release());
    },
  ]);
  for (const [name, r] of await rounds(permitTakers, contended)) {
    console.log(
      `| ${name} | ${r.rate.toFixed(0)} | ${ms(r.p50)} | ${ms(r.p99)} | ${r.min} / ${r.max} | ${r.jain.toFixed(3)} | ${r.errors} |`,
    );
  }

  console.log("\n## Redlock over 3 servers, uncontended lock + unlock\n");
  console.log("| library | cycles/s | p50 ms | p99 ms |\n|---|---|---|---|");
  const redlocks: Array<[string, Cycle]> = [];
  const ourRedlocks = [
    { name: "redislock-client Redlock (node-redis)", rl: new Redlock(await Promise.all(servers.map(async (s) => nodeRedis(await nr(s))))) },
    { name: "redislock-client Redlock (ioredis)", rl: new Redlock(servers.map((s) => ioredis(io(s, true)))) },
  ];
  for (const { name, rl } of ourRedlocks) {
    const key = fresh("r");
    redlocks.push([
      name,
      async () => {
        const lock = await rl.lock(key, { ttl: 10_000 });
        await lock.releaseAll();
      },
    ]);
  }
  const rl4x3 = new Redlock4(servers.map((s) => io(s, false)), { retryCount: -1, retryDelay: 10, retryJitter: 5 });
  const r4key = fresh("r");
  redlocks.push([
    "redlock 4.2.0 (ioredis)",
    async () => {
      const lock = await rl4x3.lock(r4key, 10_000);
      await lock.unlock();
    },
  ]);
  const semClients = servers.map((s) => io(s, false));
  const rsKey = fresh("r");
  redlocks.push([
    "redis-semaphore 5.8.0 RedlockMutex (ioredis)",
    async () => {
      const mutex = new RedlockMutex(semClients, rsKey, { lockTimeout: 10_000, acquireTimeout: 10_000, retryInterval: 10 });
      await mutex.acquire();
      await mutex.release();
    },
  ]);
  for (const [name, r] of await rounds(redlocks, uncontended)) {
    console.log(`| ${name} | ${r.rate.toFixed(0)} | ${ms(r.p50)} | ${ms(r.p99)} |`);
  }

  for (const c of clients) {
    c.close();
  }
  await Promise.all(servers.map((s) => s.stop()));
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
