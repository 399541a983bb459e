/** Every method of `LockClient` and `Lock`, on one server, through both client libraries. */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  InvalidOptionsError,
  LockAbortedError,
  LockClient,
  LockLostError,
  LockNotHeldError,
  LockTimeoutError,
  ModuleNotLoadedError,
  WouldBlockError,
} from "../src/index.js";
import { LIBS, connectedClient } from "./libs.js";
import { Server, waitUntil } from "./servers.js";

let server: Server;
let plain: Server;
before(async () => {
  [server, plain] = await Promise.all([Server.start(), Server.start({ module: false })]);
});
after(async () => {
  await Promise.all([server.stop(), plain.stop()]);
});

/** `LOCK.INFO key` through the admin connection: held or not. */
const held = async (key: string): Promise<boolean> => (await server.cmd("EXISTS", key)) === ":1";

for (const lib of LIBS) {
  describe(lib.name, () => {
    const locks = connectedClient(() => lib.single(server));
    const key = (name: string) => `${lib.name}:${name}`;

    test("lock, info, reenter, renew, release: the fence is exact and the counts follow", async () => {
      const lock = await locks.lock(key("basic"), { ttl: 10_000 });
      assert.equal(typeof lock.fence, "bigint");
      const info = await locks.info(key("basic"));
      assert.ok(info);
      assert.equal(info.owner, lock.owner);
      assert.equal(info.fence, lock.fence, "LOCK.INFO reports the same fence, to the last digit");
      assert.equal(info.count, 1);
      assert.ok(info.ttl > 9_000 && info.ttl <= 10_000, `ttl ${info.ttl}`);
      assert.equal(await lock.reenter(), 2);
      assert.equal(lock.count, 2);
      const before = lock.deadline;
      await server.cmd("PEXPIRE", key("basic"), "5000");
      await lock.renew();
      assert.ok(lock.deadline >= before);
      assert.ok(Number((await server.cmd("PTTL", key("basic"))).slice(1)) > 9_000, "renew reset the lease");
      assert.equal(await lock.release(), 1);
      assert.ok(await held(key("basic")));
      assert.equal(await lock.release(), 0);
      assert.equal(await held(key("basic")), false);
      assert.equal(await locks.info(key("basic")), null);
      await assert.rejects(lock.release(), LockNotHeldError);
      await assert.rejects(lock.renew(), LockNotHeldError);
      await assert.rejects(lock.reenter(), LockNotHeldError);
      assert.equal(lock.isLost, false, "a release is not a loss");
    });

    test("two holds in the same millisecond: the second fence is exactly one above the first", async () => {
      let sameMs = 0;
      for (let i = 0; i < 20 && sameMs < 3; i++) {
        const [a, b] = await Promise.all([
          locks.tryLock(key(`ms-a-${i}`), { ttl: 10_000 }),
          locks.tryLock(key(`ms-b-${i}`), { ttl: 10_000 }),
        ]);
        assert.ok(b.fence > a.fence, `${b.fence} above ${a.fence}`);
        if (a.fence >> 10n === b.fence >> 10n) {
          sameMs++;
          assert.equal(b.fence - a.fence, 1n, `${a.fence} then ${b.fence}`);
          // Fences stay below 2^53: a Number holds them exactly too.
          assert.equal(BigInt(Number(b.fence)), b.fence);
          assert.notEqual(Number(a.fence), Number(b.fence));
        }
        await Promise.all([a.releaseAll(), b.releaseAll()]);
      }
      assert.ok(sameMs >= 1, "no two holds fell in the same millisecond in 20 tries");
    });

    test("tryLock and wait 0: WouldBlockError while another owner holds it", async () => {
      const holder = await locks.tryLock(key("busy"), { ttl: 10_000 });
      await assert.rejects(locks.tryLock(key("busy")), WouldBlockError);
      await assert.rejects(locks.lock(key("busy"), { wait: 0 }), WouldBlockError);
      await holder.releaseAll();
      const next = await locks.tryLock(key("busy"));
      assert.ok(next.fence > holder.fence);
      await next.releaseAll();
    });

    test("a wait is served when the holder releases; the shared connection stays free meanwhile", async () => {
      const holder = await locks.lock(key("queue"), { ttl: 10_000 });
      const waiting = locks.lock(key("queue"), { ttl: 10_000, wait: Infinity });
      await waitUntil("the waiter is queued", 2_000, async () => (await locks.info(key("queue")))?.waiters === 1);
      // The parked command is on its own connection: this one answers.
      assert.equal((await locks.info(key("queue")))?.owner, holder.owner);
      await holder.release();
      const next = await waiting;
      assert.ok(next.fence > holder.fence);
      assert.equal((await locks.info(key("queue")))?.owner, next.owner);
      await next.release();
      // The wait's connection was kept for the next wait; close() closes it.
      const clients = async () => Number(/connected_clients:(\d+)/.exec(await server.cmd("INFO", "clients"))?.[1]);
      const before = await clients();
      locks.close();
      await waitUntil("the kept connection is closed", 2_000, async () => (await clients()) === before - 1);
    });

    test("a wait that ends first: LockTimeoutError, and nothing stays queued", async () => {
      const holder = await locks.lock(key("timeout"), { ttl: 10_000 });
      const started = performance.now();
      await assert.rejects(locks.lock(key("timeout"), { wait: 100 }), LockTimeoutError);
      const took = performance.now() - started;
      assert.ok(took >= 95 && took < 1_000, `took ${took} ms`);
      assert.equal((await locks.info(key("timeout")))?.waiters, 0);
      await holder.release();
    });

    test("an aborted wait leaves the queue at once and holds nothing", async () => {
      const holder = await locks.lock(key("abort"), { ttl: 10_000 });
      const controller = new AbortController();
      const waiting = locks.lock(key("abort"), { ttl: 60_000, wait: 10_000, signal: controller.signal });
      await waitUntil("the waiter is queued", 2_000, async () => (await locks.info(key("abort")))?.waiters === 1);
      const aborted = performance.now();
      controller.abort(new Error("the caller gave up"));
      await assert.rejects(waiting, LockAbortedError);
      assert.ok(performance.now() - aborted < 500);
      await waitUntil("the server dropped the waiter", 2_000, async () => (await locks.info(key("abort")))?.waiters === 0);
      await holder.release();
      assert.equal(await locks.info(key("abort")), null, "the lock is free: nobody was handed it");
      await assert.rejects(
        locks.lock(key("abort"), { signal: AbortSignal.abort() }),
        LockAbortedError,
        "an aborted signal sends nothing",
      );
    });

    test("an abort that crosses the grant: the grant is released, not left for its lease", async () => {
      for (let i = 0; i < 5; i++) {
        const name = key(`cross-${i}`);
        const holder = await locks.lock(name, { ttl: 10_000 });
        const controller = new AbortController();
        const waiting = locks.lock(name, { ttl: 60_000, wait: 10_000, signal: controller.signal });
        await waitUntil("the waiter is queued", 2_000, async () => (await locks.info(name))?.waiters === 1);
        // The release hands the lock over inside the command; the abort
        // comes while the fence is on its way to the waiter.
        await holder.release();
        controller.abort();
        const outcome = await waiting.then(
          async (lock) => {
            await lock.releaseAll();
            return "granted first";
          },
          (err: unknown) => {
            assert.ok(err instanceof LockAbortedError, String(err));
            return "aborted";
          },
        );
        await waitUntil(`the lock is free (${outcome})`, 2_000, async () => (await locks.info(name)) === null);
      }
    });

    test("a wait whose connection is killed rejects and leaves nothing queued or held", async () => {
      const holder = await locks.lock(key("killed-wait"), { ttl: 10_000 });
      // Its failure is looked at once the kill is done: caught from the start.
      const failed = locks.lock(key("killed-wait"), { ttl: 60_000, wait: 10_000 }).then(
        () => null,
        (err: unknown) => err,
      );
      await waitUntil("the waiter is queued", 2_000, async () => (await locks.info(key("killed-wait")))?.waiters === 1);
      const list = await server.cmd("CLIENT", "LIST");
      const id = /^id=(\d+) .* flags=b .*cmd=lock\.acquire/m.exec(list)?.[1]; // the blocked one
      assert.ok(id, list);
      assert.equal(await server.cmd("CLIENT", "KILL", "ID", id), ":1");
      const err = await failed;
      assert.ok(err instanceof Error && !(err instanceof LockTimeoutError), String(err));
      assert.equal((await locks.info(key("killed-wait")))?.waiters, 0);
      await holder.release();
      assert.equal(await locks.info(key("killed-wait")), null);
    });

    test("NOTOWNER: renew rejects with LockNotHeldError and lost fires", async () => {
      const lock = await locks.lock(key("stolen"), { ttl: 10_000 });
      await server.cmd("DEL", key("stolen"));
      await assert.rejects(lock.renew(), LockNotHeldError);
      assert.equal(lock.isLost, true);
      assert.ok(lock.lost.reason instanceof LockLostError);
      assert.equal(lock.lost.reason.reason, "not-owner");
      await assert.rejects(lock.release(), LockNotHeldError);
    });

    test("the watchdog keeps a short lease alive; without it, lost fires at the deadline", async () => {
      const renewed = await server.infoInt("lock", "lock_renewed");
      const kept = await locks.lock(key("dog"), { ttl: 200 });
      const bare = await locks.lock(key("bare"), { ttl: 200, watchdog: false });
      const lostAt = new Promise<number>((resolve) =>
        bare.lost.addEventListener("abort", () => resolve(performance.now()), { once: true }),
      );
      const t0 = performance.now();
      const when = await lostAt;
      assert.ok(when - t0 < 300 && when - bare.deadline > -2 && when - bare.deadline < 100, `lost ${when - bare.deadline} ms past its deadline`);
      assert.equal((bare.lost.reason as LockLostError).reason, "expired");
      await waitUntil("the watchdog renewed three times", 2_000, async () =>
        (await server.infoInt("lock", "lock_renewed")) >= renewed + 3,
      );
      assert.equal(kept.isLost, false);
      assert.equal((await locks.info(key("dog")))?.owner, kept.owner);
      await kept.release();
      const after = await server.infoInt("lock", "lock_renewed");
      await new Promise((r) => setTimeout(r, 150));
      assert.equal(await server.infoInt("lock", "lock_renewed"), after, "no renew after the release");
    });

    test("using: releases afterwards, passes the value, rethrows the callback's error", async () => {
      const value = await locks.using(key("using"), { ttl: 5_000 }, async (signal, lock) => {
        assert.equal(signal.aborted, false);
        assert.equal((await locks.info(key("using")))?.fence, lock.fence);
        return 42;
      });
      assert.equal(value, 42);
      assert.equal(await locks.info(key("using")), null);
      await assert.rejects(
        locks.using(key("using"), {}, () => {
          throw new RangeError("inside");
        }),
        RangeError,
      );
      assert.equal(await locks.info(key("using")), null);
    });

    test("using: a lock lost midway rejects with LockLostError", async () => {
      const run = locks.using(key("lost"), { ttl: 300 }, async (signal) => {
        await server.cmd("DEL", key("lost"));
        await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
        return "finished anyway";
      });
      const err = await run.then(
        () => null,
        (e: unknown) => e,
      );
      assert.ok(err instanceof LockLostError, String(err));
      assert.equal(err.reason, "not-owner");
    });

    test("options are checked before anything is sent", async () => {
      const bad: Array<[object, RegExp]> = [
        [{ ttl: 0 }, /ttl must be a whole number of ms from 1 to 2\^40, not 0/],
        [{ ttl: 1.5 }, /ttl/],
        [{ ttl: 2 ** 40 + 1 }, /ttl/],
        [{ wait: -1 }, /wait must be/],
        [{ wait: NaN }, /wait must be/],
        [{ watchdog: "yes" }, /watchdog must be true or false/],
        [{ signal: {} }, /signal must be an AbortSignal/],
        [{ ttl: 100, shared: true }, /unknown option 'shared'/],
      ];
      for (const [opts, message] of bad) {
        await assert.rejects(locks.lock(key("opts"), opts), (err: unknown) => {
          assert.ok(err instanceof InvalidOptionsError, String(err));
          assert.match(err.message, message);
          return true;
        });
      }
      await assert.rejects(locks.lock(""), TypeError);
      assert.equal(await locks.info(key("opts")), null);
    });

    test("a server without the module: ModuleNotLoadedError", async () => {
      const other = await lib.single(plain);
      try {
        const bare = new LockClient(other.transport);
        await assert.rejects(bare.tryLock("x"), ModuleNotLoadedError);
        await assert.rejects(bare.lock("x", { wait: 100 }), ModuleNotLoadedError);
      } finally {
        await other.close();
      }
    });
  });
}

test("the ioredis adapter refuses a client that would round fences", async () => {
  const { Redis } = await import("ioredis");
  const { ioredis } = await import("../src/ioredis.js");
  const client = new Redis(server.port, "127.0.0.1", { lazyConnect: true });
  assert.throws(() => ioredis(client), /stringNumbers: true/);
});

/**
 * A process that waited for a lock and then closed its client exits: the
 * connection its wait used is kept for the next wait, but idle it does not
 * keep the process alive.
 */
for (const lib of ["node-redis", "ioredis"]) {
  test(`${lib}: a waited-on connection kept for reuse does not keep the process alive`, async () => {
    const { execFile } = await import("node:child_process");
    const script = `
      import { LockClient } from "redislock-client";
      const port = ${server.port};
      let transport, close;
      if ("${lib}" === "node-redis") {
        const { createClient } = await import("redis");
        const { nodeRedis } = await import("redislock-client/node-redis");
        const c = createClient({ url: "redis://127.0.0.1:" + port });
        await c.connect();
        transport = nodeRedis(c); close = () => c.destroy();
      } else {
        const { Redis } = await import("ioredis");
        const { ioredis } = await import("redislock-client/ioredis");
        const c = new Redis(port, "127.0.0.1", { stringNumbers: true });
        transport = ioredis(c); close = () => c.disconnect();
      }
      const locks = new LockClient(transport);
      const first = await locks.lock("exit-${lib}", { ttl: 5000 });
      const waiting = locks.lock("exit-${lib}", { ttl: 5000, wait: 5000 });
      while ((await locks.info("exit-${lib}")).waiters !== 1) await new Promise((r) => setTimeout(r, 5));
      await first.release();
      const second = await waiting;
      await second.release();
      close();
      console.log("done");
    `;
    const started = performance.now();
    const output = await new Promise<string>((resolve, reject) => {
      const child = execFile(process.execPath, ["--input-type=module", "-e", script], { timeout: 5_000 }, (err, stdout) =>
        err ? reject(err) : resolve(stdout),
      );
      void child;
    });
    assert.equal(output.trim(), "done");
    assert.ok(performance.now() - started < 4_000);
  });
}

for (const lib of LIBS) {
  test(`${lib.name}: an abort while the server does not answer rejects at once and leaves nothing behind`, { timeout: 10_000 }, async () => {
    const conn = await lib.single(server);
    const locks = new LockClient(conn.transport);
    const name = `${lib.name}:stalled`;
    try {
      const holder = await locks.lock(name, { ttl: 10_000 });
      const clients = async () => (await server.cmd("INFO", "clients")).match(/connected_clients:(\d+)/)?.[1];
      const before = await clients();
      for (const stage of ["the first attempt", "the wait"]) {
        const controller = new AbortController();
        // Resumed in any case, so that a client that does not give up
        // cannot hang the suite.
        const resume = setTimeout(() => server.resume(), 1_000);
        if (stage === "the first attempt") {
          server.suspend();
        }
        const pending = locks.lock(name, { ttl: 60_000, wait: 10_000, signal: controller.signal });
        if (stage === "the wait") {
          await waitUntil("the waiter is queued", 2_000, async () => (await locks.info(name))?.waiters === 1);
          server.suspend();
        }
        await new Promise((r) => setTimeout(r, 50));
        const t = performance.now();
        controller.abort();
        try {
          await assert.rejects(pending, LockAbortedError, stage);
          assert.ok(performance.now() - t < 200, `${stage}: rejected ${performance.now() - t} ms after the abort`);
        } finally {
          clearTimeout(resume);
          server.resume();
        }
        await waitUntil(`${stage}: no waiter and no extra connection left`, 2_000, async () =>
          (await locks.info(name))?.waiters === 0 && (await clients()) === before,
        );
        assert.equal((await locks.info(name))?.owner, holder.owner);
      }
      await holder.release();
    } finally {
      await conn.close();
    }
  });
}
