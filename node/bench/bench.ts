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
 * - Redlock over 3 servers, uncontended;
 * - several at once: 32 workers each taking 2 (or 4) of 8 keys, picked at
 *   random and named in a random order, as one lock (this client's
 *   `lockKeys`, redlock's array of resources), then one `INCR`, then the
 *   release; and a semaphore of 8 permits, each request for 1, 2 or 4 of
 *   them at random (this client's `acquirePermits`, redis-semaphore's
 *   `MultiSemaphore`): acquisitions/s, the wait (p50, p99, max; per size for
 *   the semaphore), failed attempts per acquisition and server commands per
 *   acquisition (`INFO commandstats` deltas).
 *
 * `BENCH_ONLY=several` (or a comma-separated list of `uncontended`,
 * `contended`, `semaphore`, `redlock`, `several`) runs only those sections.
 * Each figure is the median of `BENCH_REPEAT` runs (default 3) of
 * `BENCH_SECONDS` each (default 2), the libraries taking turns in a rotating
 * order within each repetition.
 */

import { Redis } from "ioredis";
import { createClient } from "redis";
import Redlock4 from "redlock";
import { MultiSemaphore, Mutex, RedlockMutex, Semaphore as RsSemaphore } from "redis-semaphore";
import { LockClient, Redlock } from "../src/index.js";
import { ioredis } from "../src/ioredis.js";
import { nodeRedis } from "../src/node-redis.js";
import { Server } from "../test/servers.js";

const SECONDS = Number(process.env.BENCH_SECONDS ?? 2);
const REPEAT = Number(process.env.BENCH_REPEAT ?? 3);
const ONLY = process.env.BENCH_ONLY ? new Set(process.env.BENCH_ONLY.split(",")) : null;
const runs = (section: string) => ONLY === null || ONLY.has(section);

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

/** Keys (and permits) the several-at-once section draws from. */
const POOL = 8;

/** One hold of the several-at-once section; `failed`: attempts that did not get it, when the library counts them itself. */
interface Hold {
  release: () => Promise<void>;
  failed?: number;
}

interface SeveralSubject {
  /** Takes `size` things: the keys numbered in `picked` (size of them, in a random order), or `size` permits. */
  take: (size: number, picked: number[]) => Promise<Hold>;
  /** The sizes a request draws from, uniformly. */
  sizes: number[];
  /** Failed attempts from the run's command counts, for a library that does not count them. */
  failed?: (calls: (command: string) => number, acquisitions: number) => number;
}

/** `INFO commandstats`: calls per command (those inside scripts too). */
async function commandCalls(admin: Redis): Promise<Map<string, number>> {
  const text = await admin.info("commandstats");
  const calls = new Map<string, number>();
  for (const m of text.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) {
    calls.set(m[1]!, Number(m[2]));
  }
  return calls;
}

/** `size` distinct numbers below POOL, in a random order. */
function pick(size: number): number[] {
  const all = Array.from({ length: POOL }, (_, i) => i);
  for (let i = 0; i < size; i++) {
    const j = i + Math.floor(Math.random() * (POOL - i));
    [all[i], all[j]] = [all[j]!, all[i]!];
  }
  return all.slice(0, size);
}

/**
 * WORKERS workers for SECONDS, each taking what its draw names, one `INCR`
 * (on `work`), the release, and again. Commands per acquisition count every
 * call in `INFO commandstats` but the bench's own `INCR` and `INFO`, from
 * before the first worker starts to after the last one has released.
 */
async function severalRun(subject: SeveralSubject, admin: Redis, work: Redis): Promise<Record<string, number>> {
  const waits = new Map<number, number[]>(subject.sizes.map((k) => [k, []]));
  let acquisitions = 0;
  let counted = 0;
  let errors = 0;
  let stop = false;
  const before = await commandCalls(admin);
  const end = performance.now() + SECONDS * 1000;
  const workers = Array.from({ length: WORKERS }, async () => {
    while (!stop) {
      const size = subject.sizes[Math.floor(Math.random() * subject.sizes.length)]!;
      const picked = pick(size);
      const t = performance.now();
      let hold: Hold;
      try {
        hold = await subject.take(size, picked);
      } catch (err) {
        // Counted in the table; the first one's reason is worth seeing.
        if (errors++ === 0) {
          console.error(`first error: ${err instanceof Error ? err.message : String(err)}`);
        }
        continue;
      }
      waits.get(size)!.push(performance.now() - t);
      acquisitions++;
      counted += hold.failed ?? 0;
      await work.incr(`bench:several:n${picked[0]!}`);
      await hold.release();
    }
  });
  await new Promise((r) => setTimeout(r, end - performance.now()));
  stop = true;
  await Promise.all(workers);
  const after = await commandCalls(admin);
  const calls = (command: string) => (after.get(command) ?? 0) - (before.get(command) ?? 0);
  let commands = 0;
  for (const command of after.keys()) {
    if (command !== "info" && command !== "incr") {
      commands += calls(command);
    }
  }
  const failed = subject.failed ? subject.failed(calls, acquisitions) : counted;
  const all = [...waits.values()].flat().sort((a, b) => a - b);
  const result: Record<string, number> = {
    rate: acquisitions / SECONDS,
    p50: quantile(all, 0.5),
    p99: quantile(all, 0.99),
    max: all.length ? all[all.length - 1]! : NaN,
    failed: acquisitions ? failed / acquisitions : NaN,
    commands: acquisitions ? commands / acquisitions : NaN,
    errors,
  };
  if (subject.sizes.length > 1) {
    for (const [k, list] of waits) {
      list.sort((a, b) => a - b);
      result[`p99_${k}`] = quantile(list, 0.99);
      result[`max_${k}`] = list.length ? list[list.length - 1]! : NaN;
      result[`n_${k}`] = list.length / SECONDS;
    }
  }
  return result;
}

const per = (x: number) => (Number.isNaN(x) ? "—" : x.toFixed(2));

async function severalSection(
  one: Server,
  ours: Array<{ name: string; locks: LockClient }>,
  io: (s: Server, stringNumbers: boolean) => Redis,
): Promise<void> {
  const admin = io(one, false);
  const work = io(one, false);
  let round = 0;
  // This client tries at once on the shared connection, and on a nil joins
  // the server's queue with one `WAIT` on a connection of its own: every
  // acquire command past the one that is granted failed (at most one each).
  const ourFailed = (calls: (command: string) => number, acquisitions: number) =>
    calls("lock.acquire") + calls("lock.macquire") - acquisitions;
  // The same retry settings as the single-key sections above.
  const rl4 = new Redlock4([io(one, false)], { retryCount: -1, retryDelay: 10, retryJitter: 5 });

  for (const size of [2, 4]) {
    console.log(`\n## Several keys at once: ${WORKERS} workers, each ${size} of ${POOL} keys in a random order, one server\n`);
    console.log(
      "| library | acquisitions/s | wait p50 ms | wait p99 ms | wait max ms | failed attempts / acquisition | commands / acquisition | errors |\n|---|---|---|---|---|---|---|---|",
    );
    const subjects: Array<[string, SeveralSubject]> = [];
    for (const { name, locks } of ours) {
      const prefix = `bench:mk${round++}:`;
      subjects.push([
        `${name} lockKeys`,
        {
          sizes: [size],
          failed: ourFailed,
          take: async (_, picked) => {
            const lock = await locks.lockKeys(
              picked.map((i) => prefix + i),
              { ttl: 10_000, wait: 30_000 },
            );
            return { release: async () => void (await lock.release()) };
          },
        },
      ]);
    }
    const rlPrefix = `bench:mk${round++}:`;
    subjects.push([
      "redlock 4.2.0 (ioredis) array of resources, retry every 10 ± 5 ms",
      {
        sizes: [size],
        take: async (_, picked) => {
          const lock = await rl4.lock(
            picked.map((i) => rlPrefix + i),
            10_000,
          );
          return { release: async () => void (await lock.unlock()), failed: lock.attempts - 1 };
        },
      },
    ]);
    for (const [name, r] of await rounds(subjects, (s) => severalRun(s, admin, work))) {
      console.log(
        `| ${name} | ${r.rate!.toFixed(0)} | ${ms(r.p50!)} | ${ms(r.p99!)} | ${ms(r.max!)} | ${per(r.failed!)} | ${per(r.commands!)} | ${r.errors} |`,
      );
    }
  }

  const sizes = [1, 2, 4];
  console.log(
    `\n## Several permits at once: a semaphore of ${POOL} permits, ${WORKERS} workers, each request for ${sizes.join(", ")} of them at random, one server\n`,
  );
  console.log(
    `| library | acquisitions/s | ${sizes.map((k) => `${k}: per s, wait p99 / max ms`).join(" | ")} | failed attempts / acquisition | commands / acquisition | errors |\n|---|---|${sizes.map(() => "---|").join("")}---|---|---|`,
  );
  const subjects: Array<[string, SeveralSubject]> = [];
  for (const { name, locks } of ours) {
    const pool = locks.semaphore(`bench:ms${round++}`, POOL);
    subjects.push([
      `${name} acquirePermits`,
      {
        sizes,
        failed: ourFailed,
        take: async (size) => {
          const lock = await pool.acquirePermits(size, { ttl: 10_000, wait: 30_000 });
          return { release: async () => void (await lock.release()) };
        },
      },
    ]);
  }
  const semClient = io(one, false);
  const rsKey = `bench:ms${round++}`;
  subjects.push([
    "redis-semaphore 5.8.0 MultiSemaphore (ioredis), retry every 10 ms",
    {
      sizes,
      // Its acquire script runs one ZCARD per attempt and gives no count.
      failed: (calls, acquisitions) => calls("zcard") - acquisitions,
      take: async (size) => {
        const sem = new MultiSemaphore(semClient, rsKey, POOL, size, {
          lockTimeout: 10_000,
          acquireTimeout: 30_000,
          retryInterval: 10,
        });
        await sem.acquire();
        return { release: async () => void (await sem.release()) };
      },
    },
  ]);
  for (const [name, r] of await rounds(subjects, (s) => severalRun(s, admin, work))) {
    const bySize = sizes.map((k) => `${r[`n_${k}`]!.toFixed(0)}, ${ms(r[`p99_${k}`]!)} / ${ms(r[`max_${k}`]!)}`);
    console.log(
      `| ${name} | ${r.rate!.toFixed(0)} | ${bySize.join(" | ")} | ${per(r.failed!)} | ${per(r.commands!)} | ${r.errors} |`,
    );
  }
}

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
  if (runs("uncontended")) {
    console.log("## Uncontended lock + unlock, one caller, one server\n");
    console.log("| library | cycles/s | p50 ms | p99 ms |\n|---|---|---|---|");
  }
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
  if (runs("uncontended")) {
    for (const [name, r] of await rounds(single, uncontended)) {
      console.log(`| ${name} | ${r.rate.toFixed(0)} | ${ms(r.p50)} | ${ms(r.p99)} |`);
    }
  }

  if (runs("contended")) {
    console.log(`\n## ${WORKERS} workers on one lock, one server\n`);
    console.log(
      "| library | acquisitions/s | wait p50 ms | wait p99 ms | per worker min / max | Jain | errors |\n|---|---|---|---|---|---|---|",
    );
  }
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
  if (runs("contended")) {
    for (const [name, r] of await rounds(takers, contended)) {
      console.log(
        `| ${name} | ${r.rate.toFixed(0)} | ${ms(r.p50)} | ${ms(r.p99)} | ${r.min} / ${r.max} | ${r.jain.toFixed(3)} | ${r.errors} |`,
      );
    }
  }

  if (runs("semaphore")) {
    console.log(`\n## A semaphore of ${PERMITS} permits, ${WORKERS} workers, one server\n`);
    console.log(
      "| library | acquisitions/s | wait p50 ms | wait p99 ms | per worker min / max | Jain | errors |\n|---|---|---|---|---|---|---|",
    );
  }
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
  if (runs("semaphore")) {
    for (const [name, r] of await rounds(permitTakers, contended)) {
      console.log(
        `| ${name} | ${r.rate.toFixed(0)} | ${ms(r.p50)} | ${ms(r.p99)} | ${r.min} / ${r.max} | ${r.jain.toFixed(3)} | ${r.errors} |`,
      );
    }
  }

  if (runs("redlock")) {
    console.log("\n## Redlock over 3 servers, uncontended lock + unlock\n");
    console.log("| library | cycles/s | p50 ms | p99 ms |\n|---|---|---|---|");
  }
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
  if (runs("redlock")) {
    for (const [name, r] of await rounds(redlocks, uncontended)) {
      console.log(`| ${name} | ${r.rate.toFixed(0)} | ${ms(r.p50)} | ${ms(r.p99)} |`);
    }
  }

  if (runs("several")) {
    await severalSection(one, ours, io);
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
