/** Shared holds through both client libraries: read-write locks and semaphores. */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { InvalidOptionsError, LockTimeoutError, WouldBlockError } from "../src/index.js";
import { LIBS, connectedClient } from "./libs.js";
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
    const key = (name: string) => `${lib.name}:${name}`;
    const waiters = async (name: string) => (await locks.info(name))?.waiters ?? 0;

    test("readers share; a writer waits for every one; a later reader waits behind it", async () => {
      const k = key("rw");
      const first = await locks.readLock(k, { ttl: 10_000 });
      const second = await locks.tryReadLock(k, { ttl: 10_000 });
      assert.notEqual(first.fence, second.fence);
      const info = await locks.info(k);
      assert.ok(info);
      assert.equal(info.mode, "shared");
      assert.equal(info.owner, null);
      assert.equal(info.count, 2);
      assert.deepEqual(
        info.holders.map((h) => h.owner),
        [first.owner, second.owner],
      );
      await assert.rejects(locks.tryLock(k), WouldBlockError);
      const writer = locks.writeLock(k, { ttl: 10_000, wait: 5_000 });
      await waitUntil("the writer waits", 5_000, async () => (await waiters(k)) === 1);
      await assert.rejects(locks.tryReadLock(k), WouldBlockError, "no barging past the writer");
      const top = second.fence > first.fence ? second.fence : first.fence;
      await first.release();
      await second.release();
      const w = await writer;
      assert.ok(w.fence > top, "the writer's fence is above every reader's");
      assert.equal((await locks.info(k))?.mode, "exclusive");
      await w.release();
      assert.equal(await locks.info(k), null);
    });

    test("a semaphore holds at most its limit and hands a permit on in order", async () => {
      const k = key("sem");
      const pool = locks.semaphore(k, 2);
      assert.equal(pool.limit, 2);
      const a = await pool.acquire({ ttl: 10_000 });
      const b = await pool.tryAcquire({ ttl: 10_000 });
      await assert.rejects(pool.tryAcquire(), WouldBlockError);
      await assert.rejects(pool.acquire({ wait: 100 }), LockTimeoutError);
      const third = pool.acquire({ ttl: 10_000, wait: 5_000 });
      await waitUntil("a permit is awaited", 5_000, async () => (await waiters(k)) === 1);
      assert.equal((await locks.info(k))?.limit, 2);
      await a.release();
      const c = await third;
      assert.ok(c.fence > b.fence);
      assert.deepEqual(
        (await locks.info(k))?.holders.map((h) => h.owner),
        [b.owner, c.owner],
      );
      // Another limit while permits are held: refused, nothing changes.
      await assert.rejects(locks.semaphore(k, 3).tryAcquire());
      assert.equal((await locks.info(k))?.count, 2);
      await b.release();
      await c.release();
      assert.throws(() => locks.semaphore(k, 0), InvalidOptionsError);
      assert.throws(() => locks.semaphore(k, 1_000_001), InvalidOptionsError);
      assert.throws(() => locks.semaphore(k, 2.5), InvalidOptionsError);
    });

    test("a permit renews itself and reports its loss on its own", async () => {
      const k = key("permit-loss");
      const pool = locks.semaphore(k, 3);
      const kept = await pool.acquire({ ttl: 300 });
      const lost = await pool.acquire({ ttl: 300 });
      await server.cmd("LOCK.RELEASE", k, lost.owner);
      await waitUntil("the loss is reported", 2_000, () => lost.lost.aborted);
      await new Promise((r) => setTimeout(r, 900)); // three leases
      assert.equal(kept.lost.aborted, false);
      assert.deepEqual(
        (await locks.info(k))?.holders.map((h) => h.owner),
        [kept.owner],
      );
      await kept.release();
    });

    test("using() on a semaphore releases the permit afterwards", async () => {
      const k = key("sem-using");
      const pool = locks.semaphore(k, 1);
      const seen = await pool.using({ ttl: 5_000 }, async (signal, permit) => {
        assert.equal(signal.aborted, false);
        return (await locks.info(k))?.holders[0]?.owner === permit.owner;
      });
      assert.equal(seen, true);
      assert.equal(await locks.info(k), null);
    });
  });
}
