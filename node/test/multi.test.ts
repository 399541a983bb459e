/** Several at once through both client libraries: locks on several keys, and several permits. */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { InvalidOptionsError, type Lock, LockLostError, WouldBlockError } from "../src/index.js";
import { type Connected, LIBS, connectedClient } from "./libs.js";
import { Server, waitUntil } from "./servers.js";

let server: Server;
before(async () => {
  server = await Server.start();
});
after(async () => {
  await server.stop();
});

for (const lib of LIBS) {
  describe(lib.name, () => {
    const locks = connectedClient(() => lib.single(server));
    let side: Connected;
    before(async () => {
      side = await lib.single(server);
    });
    after(async () => {
      await side.close();
    });
    const keys = (name: string) => [`${lib.name}:${name}:a`, `${lib.name}:${name}:b`, `${lib.name}:${name}:c`];
    const waiters = async (name: string) => (await locks.info(name))?.waiters ?? 0;
    const allFree = async (names: string[]) => {
      for (const k of names) {
        assert.equal(await locks.info(k), null, `${k} is free`);
      }
    };

    test("every key is taken with a fence each, in key order, and released together", async () => {
      const ks = keys("all");
      const lock = await locks.tryLockKeys(ks, { ttl: 10_000 });
      assert.deepEqual(lock.keys, ks);
      assert.equal(lock.fences.length, 3);
      assert.ok(lock.fences[0]! < lock.fences[1]! && lock.fences[1]! < lock.fences[2]!);
      assert.equal(lock.fence, lock.fences[2]);
      for (const [i, k] of ks.entries()) {
        const info = await locks.info(k);
        assert.equal(info?.owner, lock.owner);
        assert.equal(info?.fence, lock.fences[i]);
      }
      assert.equal(await lock.release(), 0);
      await allFree(ks);
    });

    test("a try with one key held elsewhere holds no key", async () => {
      const ks = keys("none");
      const other = await locks.tryLock(ks[1]!, { ttl: 10_000 });
      await assert.rejects(locks.tryLockKeys(ks, { ttl: 10_000 }), WouldBlockError);
      await allFree([ks[0]!, ks[2]!]);
      await other.release();
    });

    test("locks on the same keys in crossing orders are served in turn", async () => {
      const ks = keys("cross");
      const blocker = await locks.tryLock(ks[0]!, { ttl: 10_000 });
      const forward = locks.lockKeys(ks, { ttl: 10_000, wait: 10_000 });
      await waitUntil("the first waits", 5_000, async () => (await waiters(ks[0]!)) === 1);
      const backward = locks.lockKeys([...ks].reverse(), { ttl: 10_000, wait: 10_000 });
      await waitUntil("both wait", 5_000, async () => (await waiters(ks[0]!)) === 2);
      await allFree([ks[1]!, ks[2]!]);
      await blocker.release();
      const first = await forward;
      let second: Lock | undefined;
      void backward.then((l) => (second = l));
      await new Promise((resolve) => setTimeout(resolve, 200));
      assert.equal(second, undefined, "both granted at once");
      await first.release();
      const last = await backward;
      assert.deepEqual(last.keys, [...ks].reverse());
      await last.release();
      await allFree(ks);
    });

    test("one renewal keeps every key; a deleted key loses the lock", async () => {
      const ks = keys("loss");
      const lock = await locks.tryLockKeys(ks, { ttl: 1_500 });
      await new Promise((resolve) => setTimeout(resolve, 2_500));
      assert.ok(lock.isHeld);
      for (const k of ks) {
        assert.notEqual(await locks.info(k), null, `${k} kept`);
      }
      await side.transport.call(ks[1]!, ["DEL", ks[1]!]);
      await waitUntil("the loss", 5_000, async () => lock.isLost);
      assert.ok(lock.lost.reason instanceof LockLostError);
      assert.equal((lock.lost.reason as LockLostError).reason, "not-owner");
      await assert.rejects(lock.renew());
    });

    test("an aborted wait holds no key", async () => {
      const ks = keys("abort");
      const blocker = await locks.tryLock(ks[2]!, { ttl: 10_000 });
      const controller = new AbortController();
      const waiting = locks.lockKeys(ks, { ttl: 10_000, wait: 10_000, signal: controller.signal });
      await waitUntil("it waits", 5_000, async () => (await waiters(ks[2]!)) === 1);
      controller.abort();
      await assert.rejects(waiting);
      await waitUntil("it left the queue", 5_000, async () => (await waiters(ks[2]!)) === 0);
      await blocker.release();
      await allFree(ks);
    });

    test("bad key lists are refused before anything is sent", async () => {
      await assert.rejects(locks.tryLockKeys([]), InvalidOptionsError);
      await assert.rejects(locks.tryLockKeys(["a", "b", "a"]), InvalidOptionsError);
    });

    test("permits: a big request at the head is not overtaken by smaller ones", async () => {
      const k = `${lib.name}:permits`;
      const pool = locks.semaphore(k, 4);
      const first = await pool.acquirePermits(2, { ttl: 10_000 });
      const big = pool.acquirePermits(3, { ttl: 10_000, wait: 10_000 });
      await waitUntil("the big request waits", 5_000, async () => (await waiters(k)) === 1);
      await assert.rejects(pool.tryAcquire({ ttl: 10_000 }), WouldBlockError);
      const small = pool.acquirePermits(1, { ttl: 10_000, wait: 10_000 });
      await waitUntil("the small request waits", 5_000, async () => (await waiters(k)) === 2);
      await first.release();
      const [b, s] = await Promise.all([big, small]);
      const held = (await locks.info(k))?.holders.map((h) => h.permits).sort();
      assert.deepEqual(held, [1, 3]);
      await b.release();
      await s.release();
      assert.equal(await locks.info(k), null);
      assert.throws(() => pool.acquirePermits(5), InvalidOptionsError);
    });
  });
}
