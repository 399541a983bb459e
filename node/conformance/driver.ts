/**
 * The Node client's driver for the conformance suite (`tests/conformance/`
 * at the repository root): reads requests of the line protocol in
 * `docs/conformance.md` on standard input, runs each as a task of its own
 * (pipelined requests run at once), and writes replies and `! lost` events
 * on standard output, one line each.
 *
 * ```text
 * npm run build:test
 * LOCK_DRIVER="node node/dist-test/conformance/driver.js --lib ioredis" \
 *   cargo test --release --test conformance
 * ```
 *
 * How the protocol's words map onto this client: `--lib node-redis|ioredis`
 * picks the adapter (default node-redis). `obj` names a `ReadWriteLock`
 * handle (both sides share its owner) or a `Semaphore`; for `kind=lock` it
 * has no meaning, since every lock call has an owner of its own, and
 * `thread` has none either (one event loop; each call is its own owner).
 * `cancel=<ms>` aborts the call's `AbortSignal` after that long. `leaks`
 * is `backgroundTasks()`.
 */

import { createInterface } from "node:readline";
import {
  InvalidOptionsError,
  LimitMismatchError,
  type Lock,
  LockAbortedError,
  LockClient,
  LockLostError,
  LockNotHeldError,
  LockRefusedError,
  type LockOptions,
  LockTimeoutError,
  NoQuorumError,
  QuarantineError,
  ReadWriteLock,
  Redlock,
  Semaphore,
  type Transport,
  UpgradeError,
  WouldBlockError,
  backgroundTasks,
} from "../src/index.js";

// Only the library asked for is loaded: loading both doubles the start-up.
const loadNodeRedis = async () => ({ ...(await import("redis")), ...(await import("../src/node-redis.js")) });
const loadIoredis = async () => ({ ...(await import("ioredis")), ...(await import("../src/ioredis.js")) });

/** A failed request: its kind (the protocol's error names) and a message for people. */
class Fail extends Error {
  constructor(
    readonly kind: string,
    message: string,
  ) {
    super(message);
  }
}

const bad = (why: string) => new Fail("bad-request", why);

/** The protocol's kind for an error of this client. */
function kindOf(err: unknown): string {
  if (err instanceof Fail) {
    return err.kind;
  }
  if (err instanceof LockLostError) {
    return "lost";
  }
  if (err instanceof LockNotHeldError) {
    return "not-owner";
  }
  if (err instanceof WouldBlockError || err instanceof NoQuorumError) {
    return "not-obtained";
  }
  if (err instanceof LockTimeoutError) {
    return "timeout";
  }
  if (err instanceof LockAbortedError) {
    return "cancelled";
  }
  if (err instanceof UpgradeError) {
    return "upgrade";
  }
  if (err instanceof LimitMismatchError) {
    return "limit-mismatch";
  }
  if (err instanceof QuarantineError) {
    return "quarantine";
  }
  if (err instanceof LockRefusedError || err instanceof InvalidOptionsError) {
    return "refused";
  }
  return "transport";
}

/** One line out: `write` on a pipe keeps lines whole and in order. */
function emit(line: string): void {
  process.stdout.write(`${line}\n`);
}

type Lib = "node-redis" | "ioredis";

function libFromArgs(argv: string[]): Lib {
  const at = argv.indexOf("--lib");
  const lib = at >= 0 ? argv[at + 1] : "node-redis";
  if (lib !== "node-redis" && lib !== "ioredis") {
    process.stderr.write(`--lib must be node-redis or ioredis, not ${String(lib)}\n`);
    process.exit(2);
  }
  return lib;
}

const lib = libFromArgs(process.argv.slice(2));

/** Where the locks are: one server, a cluster or a Sentinel's master (`LockClient`), or Redlock. */
type Target = { kind: "one"; client: LockClient } | { kind: "redlock"; redlock: Redlock };

/** One hold the suite named with `h=`. */
interface Hold {
  lock: Lock;
}

let target: Target | null = null;
/** A `connect` under way: requests pipelined behind it wait for it. */
let connecting: Promise<unknown> = Promise.resolve();
const closers: Array<() => void> = [];
const holds = new Map<string, Hold>();
const objs = new Map<string, ReadWriteLock | Semaphore>();

/** A request's `name=value` arguments. */
class Args {
  readonly #map = new Map<string, string>();
  constructor(words: string[]) {
    for (const word of words) {
      const eq = word.indexOf("=");
      if (eq <= 0) {
        throw bad(`not name=value: ${word}`);
      }
      this.#map.set(word.slice(0, eq), word.slice(eq + 1));
    }
  }
  get(name: string): string | undefined {
    return this.#map.get(name);
  }
  need(name: string): string {
    const value = this.#map.get(name);
    if (value === undefined) {
      throw bad(`missing ${name}=`);
    }
    return value;
  }
  ms(name: string): number | undefined {
    const value = this.#map.get(name);
    if (value === undefined) {
      return undefined;
    }
    if (!/^\d+$/.test(value)) {
      throw bad(`${name}= is not a number of ms: ${value}`);
    }
    return Number(value);
  }
}

async function connectOne(url: string): Promise<Transport> {
  if (lib === "node-redis") {
    const { createClient, nodeRedis } = await loadNodeRedis();
    const client = createClient({ url });
    client.on("error", () => undefined);
    await client.connect();
    closers.push(() => client.destroy());
    return nodeRedis(client);
  }
  const { Redis, ioredis } = await loadIoredis();
  const client = new Redis(url, { stringNumbers: true, lazyConnect: true });
  client.on("error", () => undefined);
  await client.connect();
  closers.push(() => client.disconnect());
  return ioredis(client);
}

async function connect(args: Args): Promise<string> {
  const topology = args.get("topology") ?? "single";
  switch (topology) {
    case "single":
      target = { kind: "one", client: new LockClient(await connectOne(args.need("url"))) };
      break;
    case "redlock": {
      const transports = await Promise.all(args.need("urls").split(",").map(connectOne));
      target = { kind: "redlock", redlock: new Redlock(transports) };
      break;
    }
    case "cluster": {
      const url = new URL(args.need("url"));
      if (lib === "node-redis") {
        const { createCluster, nodeRedis } = await loadNodeRedis();
        const cluster = createCluster({ rootNodes: [{ url: args.need("url") }] });
        cluster.on("error", () => undefined);
        await cluster.connect();
        closers.push(() => cluster.destroy());
        target = { kind: "one", client: new LockClient(nodeRedis(cluster)) };
      } else {
        const { Cluster, ioredis } = await loadIoredis();
        const cluster = new Cluster([{ host: url.hostname, port: Number(url.port) }], {
          redisOptions: { stringNumbers: true },
          lazyConnect: true,
        });
        cluster.on("error", () => undefined);
        await cluster.connect();
        closers.push(() => cluster.disconnect());
        target = { kind: "one", client: new LockClient(ioredis(cluster)) };
      }
      break;
    }
    case "sentinel": {
      if (lib !== "ioredis") {
        throw new Fail("unsupported", "the node-redis adapter takes no Sentinel client");
      }
      const url = new URL(args.need("url"));
      const { Redis, ioredis } = await loadIoredis();
      const client = new Redis({
        sentinels: [{ host: url.hostname, port: Number(url.port) }],
        name: args.need("master"),
        stringNumbers: true,
        lazyConnect: true,
      });
      client.on("error", () => undefined);
      await client.connect();
      closers.push(() => client.disconnect());
      target = { kind: "one", client: new LockClient(ioredis(client)) };
      break;
    }
    default:
      throw bad(`unknown topology ${topology}`);
  }
  return "";
}

function connected(): Target {
  if (target === null) {
    throw bad("connect first");
  }
  return target;
}

/** The lock options an `acquire` asks for; `signal` aborts after `cancel=` ms. */
function options(args: Args, signal: AbortSignal | undefined): LockOptions {
  const opts: LockOptions = {};
  const ttl = args.ms("ttl");
  if (ttl !== undefined) {
    opts.ttl = ttl;
  }
  const wait = args.get("wait");
  opts.wait = wait === undefined ? 0 : wait === "forever" ? Infinity : (args.ms("wait") as number);
  const renew = args.get("renew") ?? "auto";
  if (renew !== "auto" && renew !== "off") {
    throw bad(`renew=${renew}`);
  }
  opts.watchdog = renew === "auto";
  const ephemeral = args.get("ephemeral") ?? "0";
  if (ephemeral !== "0" && ephemeral !== "1") {
    throw bad(`ephemeral=${ephemeral}`);
  }
  if (ephemeral === "1") {
    opts.ephemeral = true;
  }
  if (signal !== undefined) {
    opts.signal = signal;
  }
  return opts;
}

/** An `AbortSignal` that aborts after `cancel=` ms, or none. */
function cancelSignal(args: Args): { signal: AbortSignal | undefined; done: () => void } {
  const ms = args.ms("cancel");
  if (ms === undefined) {
    return { signal: undefined, done: () => undefined };
  }
  const controller = new AbortController();
  if (ms === 0) {
    // Cancelled before anything is sent.
    controller.abort(new Error("cancelled at once"));
    return { signal: controller.signal, done: () => undefined };
  }
  const timer = setTimeout(() => controller.abort(new Error(`cancelled after ${ms} ms`)), ms);
  return { signal: controller.signal, done: () => clearTimeout(timer) };
}

/** The read-write handle or semaphore named `obj=`, made on first use. */
function object(client: LockClient, args: Args, kind: string): ReadWriteLock | Semaphore {
  const key = args.need("key");
  const make = () => (kind === "permit" ? client.semaphore(key, args.ms("limit") ?? 1) : client.readWriteLock(key));
  const name = args.get("obj");
  if (name === undefined) {
    return make();
  }
  let obj = objs.get(name);
  if (obj === undefined) {
    obj = make();
    objs.set(name, obj);
  }
  if ((kind === "permit") !== obj instanceof Semaphore) {
    throw bad(`obj=${name} is not a ${kind === "permit" ? "semaphore" : "read-write lock"}`);
  }
  return obj;
}

async function acquire(args: Args): Promise<string> {
  const h = args.need("h");
  const keys = args.get("keys")?.split(",");
  const key = keys?.[0] ?? args.need("key");
  const kind = args.get("kind") ?? "lock";
  const waits = args.get("wait") !== undefined;
  const where = connected();
  const cancel = cancelSignal(args);
  try {
    const opts = options(args, cancel.signal);
    let lock: Lock;
    if (keys !== undefined) {
      if (where.kind !== "one" || kind !== "lock") {
        throw new Fail("unsupported", "several keys at once: exclusive locks on one server");
      }
      lock = waits ? await where.client.lockKeys(keys, opts) : await where.client.tryLockKeys(keys, opts);
    } else if (where.kind === "redlock") {
      if (kind !== "lock") {
        throw new Fail("unsupported", "Redlock has exclusive locks only");
      }
      lock = waits ? await where.redlock.lock(key, opts) : await where.redlock.tryLock(key, opts);
    } else if (kind === "lock") {
      lock = waits ? await where.client.lock(key, opts) : await where.client.tryLock(key, opts);
    } else if (kind === "read" || kind === "write" || kind === "permit") {
      const obj = object(where.client, args, kind);
      if (obj instanceof Semaphore) {
        const permits = args.ms("permits") ?? 1;
        lock = waits ? await obj.acquirePermits(permits, opts) : await obj.tryAcquirePermits(permits, opts);
      } else if (kind === "read") {
        lock = waits ? await obj.readLock(opts) : await obj.tryReadLock(opts);
      } else {
        lock = waits ? await obj.writeLock(opts) : await obj.tryWriteLock(opts);
      }
    } else {
      throw bad(`kind=${kind}`);
    }
    return keep(h, lock);
  } finally {
    cancel.done();
  }
}

/** Files a new lock under `h`, reports its loss as an event, and gives the reply's fields. */
function keep(h: string, lock: Lock): string {
  holds.set(h, { lock });
  const report = () => emit(`! lost h=${h} reason=${(lock.lost.reason as LockLostError).reason}`);
  // The reply is written first (the caller returns it synchronously after
  // this); a loss already signalled is reported right after it.
  if (lock.isLost) {
    setImmediate(report);
  } else {
    lock.lost.addEventListener("abort", report, { once: true });
  }
  // A lock on several keys: the first key's fence, and every key's.
  const fences = lock.fences.length > 1 ? ` fences=${lock.fences.join(",")}` : "";
  return `fence=${lock.fences[0]}${fences} owner=${lock.owner}`;
}

function hold(args: Args): Hold {
  const h = args.need("h");
  const found = holds.get(h);
  if (found === undefined) {
    throw bad(`no hold h=${h}`);
  }
  return found;
}

async function release(args: Args): Promise<string> {
  const { lock } = hold(args);
  const cancel = cancelSignal(args);
  try {
    const opts = cancel.signal === undefined ? {} : { signal: cancel.signal };
    if (args.get("all") === "1") {
      await lock.releaseAll(opts);
      return "";
    }
    return `left=${await lock.release(opts)}`;
  } finally {
    cancel.done();
  }
}

async function resume(args: Args): Promise<string> {
  const h = args.need("h");
  const where = connected();
  if (where.kind !== "one") {
    throw new Fail("unsupported", "resume on Redlock");
  }
  const fence = args.get("fence");
  if (fence !== undefined && !/^\d+$/.test(fence)) {
    throw bad(`fence=${fence}`);
  }
  const renew = args.get("renew") ?? "auto";
  if (renew !== "auto" && renew !== "off") {
    throw bad(`renew=${renew}`);
  }
  const ttl = args.ms("ttl");
  if (ttl === undefined) {
    throw bad("resume needs ttl=");
  }
  const lock = await where.client.resume(args.need("key"), {
    owner: args.need("owner"),
    ttl,
    watchdog: renew === "auto",
    ...(fence === undefined ? {} : { fence: BigInt(fence) }),
  });
  return keep(h, lock);
}

async function run(verb: string, args: Args): Promise<string> {
  if (verb === "connect") {
    const done = connect(args);
    connecting = done.catch(() => undefined);
    return done;
  }
  await connecting;
  switch (verb) {
    case "acquire":
      return acquire(args);
    case "renew": {
      const { lock } = hold(args);
      await lock.renew(args.ms("ttl"));
      return "";
    }
    case "release":
      return release(args);
    case "stop-renew":
      hold(args).lock.stopRenewing();
      return "";
    case "resume":
      return resume(args);
    case "status": {
      const { lock } = hold(args);
      const reason = (lock.lost.reason as LockLostError | undefined)?.reason ?? "-";
      return `held=${lock.isHeld ? 1 : 0} lost=${lock.isLost ? 1 : 0} reason=${reason} fence=${lock.fences[0]}`;
    }
    case "leaks":
      return `running=${backgroundTasks()}`;
    default:
      throw new Fail("unsupported", `unknown verb ${verb}`);
  }
}

function main(): void {
  const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
  lines.on("line", (line) => {
    const words = line.trim().split(/\s+/);
    const [id, verb] = words;
    if (id === undefined || id === "" || verb === undefined) {
      return;
    }
    if (verb === "quit") {
      emit(`${id} ok`);
      process.exit(0);
    }
    void (async () => {
      try {
        const fields = await run(verb, new Args(words.slice(2)));
        emit(fields === "" ? `${id} ok` : `${id} ok ${fields}`);
      } catch (err) {
        const text = (err instanceof Error ? err.message : String(err)).replace(/\s+/g, " ");
        emit(`${id} err ${kindOf(err)} ${text}`);
      }
    })();
  });
  // Standard input closed: holds still open are abandoned, as a crashing
  // application would leave them.
  lines.on("close", () => {
    for (const close of closers) {
      close();
    }
    process.exit(0);
  });
}

main();
