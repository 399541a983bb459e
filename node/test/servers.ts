/**
 * Real servers for the tests: `redis-server` (or `LOCK_SERVER`) processes
 * on free loopback ports with the module (`LOCK_MODULE`) loaded, and small
 * clusters built with `redis-cli --cluster create` (`LOCK_CLI`), as the
 * Rust harness does.
 */

import { type ChildProcess, execFile, spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);
const here = path.dirname(fileURLToPath(import.meta.url));

/** The module under test: `LOCK_MODULE`, else the release build of the repository. */
export function modulePath(): string {
  const found = process.env.LOCK_MODULE || path.resolve(here, "../../../target/release/libredislock.so");
  if (!existsSync(found)) {
    throw new Error(`module ${found} not found: build it first (cargo build --release; make test does it)`);
  }
  return found;
}

export const serverBin = (): string => process.env.LOCK_SERVER || process.env.REDIS_SERVER || "redis-server";
export const cliBin = (): string => process.env.LOCK_CLI || process.env.REDIS_CLI || "redis-cli";

const started = new Set<Server>();
process.on("exit", () => {
  for (const server of started) {
    server.child?.kill("SIGKILL");
  }
});

export interface ServerOptions {
  module?: boolean;
  cluster?: boolean;
  /** Startup configs, `--name value`. */
  config?: Record<string, string>;
}

/** Polls `ready` every 5 ms until it holds; throws naming `what` after `timeoutMs`. */
export async function waitUntil(what: string, timeoutMs: number, ready: () => boolean | Promise<boolean>): Promise<void> {
  const end = performance.now() + timeoutMs;
  for (;;) {
    if (await ready()) {
      return;
    }
    if (performance.now() > end) {
      throw new Error(`timed out after ${timeoutMs} ms waiting until ${what}`);
    }
    await new Promise((r) => setTimeout(r, 5));
  }
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = net.createServer();
    probe.unref();
    probe.on("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const address = probe.address();
      probe.close(() => resolve(typeof address === "object" && address ? address.port : 0));
    });
  });
}

function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = net.createServer();
    probe.unref();
    probe.once("error", () => resolve(false));
    probe.listen(port, "127.0.0.1", () => probe.close(() => resolve(true)));
  });
}

/** Sends one command in RESP and resolves with the raw reply text (the first line or bulk). */
export function raw(port: number, args: string[], timeoutMs = 2_000): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, "127.0.0.1");
    let data = "";
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`no reply to ${args.join(" ")} within ${timeoutMs} ms`));
    }, timeoutMs);
    socket.on("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
    socket.on("data", (chunk) => {
      data += chunk.toString();
      const first = data.indexOf("\r\n");
      if (first < 0) {
        return;
      }
      if (data.startsWith("$") && !data.startsWith("$-1")) {
        const size = Number(data.slice(1, first));
        if (data.length < first + 2 + size + 2) {
          return;
        }
        clearTimeout(timer);
        socket.destroy();
        resolve(data.slice(first + 2, first + 2 + size));
        return;
      }
      clearTimeout(timer);
      socket.destroy();
      resolve(data.slice(0, first));
    });
    socket.write(args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).reduce((s, a) => s + a, `*${args.length}\r\n`));
  });
}

export class Server {
  port = 0;
  child: ChildProcess | null = null;
  readonly dir: string;
  constructor(private readonly options: ServerOptions) {
    this.dir = mkdtempSync(path.join(tmpdir(), "redislock-node-"));
  }

  static async start(options: ServerOptions = {}): Promise<Server> {
    const server = new Server(options);
    for (let attempt = 0; ; attempt++) {
      server.port = await freePort();
      if (options.cluster && !(await portFree(server.port + 10_000))) {
        continue;
      }
      try {
        await server.launch();
        started.add(server);
        return server;
      } catch (err) {
        if (attempt >= 4) {
          throw err;
        }
      }
    }
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  #args(): string[] {
    const config: Record<string, string> = {
      port: String(this.port),
      bind: "127.0.0.1",
      daemonize: "no",
      dir: this.dir,
      logfile: path.join(this.dir, "redis.log"),
      save: "",
      appendonly: "no",
      ...(this.options.cluster
        ? { "cluster-enabled": "yes", "cluster-config-file": "nodes.conf", "cluster-node-timeout": "5000" }
        : {}),
      ...this.options.config,
    };
    const args: string[] = [];
    if (this.options.module !== false) {
      args.push("--loadmodule", modulePath());
    }
    for (const [name, value] of Object.entries(config)) {
      args.push(`--${name}`, ...(value === "" ? [""] : value.split(" ")));
    }
    return args;
  }

  async launch(): Promise<void> {
    const child = spawn(serverBin(), this.#args(), { stdio: "ignore" });
    this.child = child;
    let exited: string | null = null;
    child.once("exit", (code, signal) => {
      exited = `exited (${code ?? signal})`;
      if (this.child === child) {
        this.child = null;
      }
    });
    child.once("error", (err) => {
      exited = String(err);
    });
    await waitUntil(`the server on port ${this.port} answers PING`, 10_000, async () => {
      if (exited !== null) {
        throw new Error(`${serverBin()} on port ${this.port} ${exited}; log in ${this.dir}`);
      }
      return (await raw(this.port, ["PING"], 500).catch(() => "")) === "+PONG";
    });
  }

  /** `kill -9`; `startAgain` brings it back on the same port and dir. */
  async kill(): Promise<void> {
    const child = this.child;
    if (child === null) {
      return;
    }
    const gone = new Promise((r) => child.once("exit", r));
    child.kill("SIGKILL");
    await gone;
  }

  async startAgain(): Promise<void> {
    await this.launch();
  }

  suspend(): void {
    this.child?.kill("SIGSTOP");
  }

  resume(): void {
    this.child?.kill("SIGCONT");
  }

  /** One command through `raw`: the reply's first line (or bulk). */
  cmd(...args: string[]): Promise<string> {
    return raw(this.port, args);
  }

  async infoInt(section: string, field: string): Promise<number> {
    const text = await this.cmd("INFO", section);
    const found = new RegExp(`^${field}:(\\d+)`, "m").exec(text);
    if (!found) {
      throw new Error(`no ${field} in INFO ${section}`);
    }
    return Number(found[1]);
  }

  async stop(): Promise<void> {
    started.delete(this);
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** Three masters, no replicas, every slot served and every node agreeing. */
export async function startCluster(): Promise<Server[]> {
  const nodes = await Promise.all([0, 1, 2].map(() => Server.start({ cluster: true })));
  await run(cliBin(), [
    "--cluster",
    "create",
    ...nodes.map((n) => `127.0.0.1:${n.port}`),
    "--cluster-replicas",
    "0",
    "--cluster-yes",
  ]);
  await waitUntil("every node sees a whole cluster", 20_000, async () => {
    for (const node of nodes) {
      const info = await node.cmd("CLUSTER", "INFO");
      if (!info.includes("cluster_state:ok") || !info.includes("cluster_known_nodes:3")) {
        return false;
      }
    }
    return true;
  });
  return nodes;
}

/** The node id of a cluster node (`CLUSTER MYID`). */
export function nodeId(node: Server): Promise<string> {
  return node.cmd("CLUSTER", "MYID");
}
