/**
 * The client contract's rules that one server shows, through both client
 * libraries: ephemeral on every acquire path, one owner per read-write
 * handle, durations past setTimeout's range, a key overwritten under a
 * hold, a grant whose confirming renew finds it gone, a release that does
 * not complete, an abort that crosses a grant; and the hand-over features
 * (renew with a new ttl, stop renewing, resume by owner token).
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { createClient } from "redis";
import * as redislock from "../src/index.js";
import { LockAbortedError, LockClient, LockLostError, type Lock } from "../src/index.js";
import { LIBS, connectedClient } from "./libs.js";
import { Server, waitUntil } from "./servers.js";

let server: Server;
let admin: ReturnType<typeof createClient>;
before(async () => {
  server = await Server.start();
  admin = createClient({ url: server.url });
  admin.on("error", () => undefined);
  await admin.connect();
});
after(async () => {
  admin.destroy();
  await server.stop();
});

/** `LOCK.INFO` as the server says it, flattened to text: enough to find a field's value. */
async function infoText(key: string): Promise<string> {
  return JSON.stringify(await admin.sendCommand(["LOCK.INFO", key]));
}

/** Whether the server marks a hold on `key` ephemeral. */
async function ephemeralOnServer(key: string): Promise<boolean> {
  return /"ephemeral"[,:]\s*"?1"?/.test(await infoText(key));
}

/** Ids of the connections whose last command was `LOCK.ACQUIRE`. */
async function acquirers(): Promise<string[]> {
  const list = String(await admin.sendCommand(["CLIENT", "LIST"]));
  return list
    .split("\n")
    .filter((line) => line.includes("cmd=lock.acquire"))
    .map((line) => /id=(\d+)/.exec(line)?.[1] ?? "");
}

const lossReason = (lock: Lock): string | undefined => (lock.lost.reason as LockLostError | undefined)?.reason;

for (const lib of LIBS) {
  describe(lib.name, () => {
    const locks = connectedClient(() => lib.single(server));
    const key = (name: string) => `${lib.name}:contract:${name}`;
    // Client logic the adapter takes no part in is checked through one
    // library (half through each), to keep the suite short; the
    // conformance suite runs all of it through both.
    const through = (name: string): typeof test => (lib.name === name ? test : ((() => undefined) as unknown as typeof test));

    test("every acquire path honours ephemeral: its own connection, closed means lost", async () => {
      const paths: Array<[string, (k: string) => Promise<Lock>]> = [
        ["tryLock", (k) => locks.tryLock(k, { ttl: 30_000, ephemeral: true })],
        ["lock wait 0", (k) => locks.lock(k, { ttl: 30_000, wait: 0, ephemeral: true })],
        ["tryReadLock", (k) => locks.tryReadLock(k, { ttl: 30_000, ephemeral: true })],
        ["readLock", (k) => locks.readLock(k, { ttl: 30_000, ephemeral: true })],
        ["writeLock", (k) => locks.writeLock(k, { ttl: 30_000, ephemeral: true })],
        ["semaphore tryAcquire", (k) => locks.semaphore(k, 2).tryAcquire({ ttl: 30_000, ephemeral: true })],
        ["semaphore acquire", (k) => locks.semaphore(k, 2).acquire({ ttl: 30_000, ephemeral: true })],
      ];
      for (const [path, take] of paths) {
        const k = key(`eph-${path}`);
        const lock = await take(k);
        assert.ok(await ephemeralOnServer(k), `${path}: the server holds it ephemeral: ${await infoText(k)}`);
        const ids = await acquirers();
        assert.equal(ids.length, 1, `${path}: one hold connection`);
        await admin.sendCommand(["CLIENT", "KILL", "ID", ids[0] as string]);
        await waitUntil(`${path}: lost fires`, 2_000, () => lock.isLost);
        assert.equal(lossReason(lock), "disconnected", path);
        assert.equal(await locks.info(k), null, `${path}: ended at once, not at its lease end`);
      }
    });

    through("node-redis")("a reader asking for the write side of its own handle is refused at once", async () => {
      const k = key("upgrade");
      const rw = locks.readWriteLock(k);
      const read = await rw.readLock({ ttl: 10_000 });
      const asked = performance.now();
      await assert.rejects(rw.writeLock({ ttl: 10_000, wait: 5_000 }), redislock.UpgradeError);
      await assert.rejects(rw.tryWriteLock({ ttl: 10_000 }), redislock.UpgradeError);
      assert.ok(performance.now() - asked < 1_000, `refused after ${performance.now() - asked} ms`);
      assert.equal((await locks.info(k))?.waiters, 0, "nothing queued");
      assert.equal(read.isLost, false);
      await read.release();
      assert.equal(await locks.info(k), null);
      // The writer may read: a reentry of its own hold, same fence.
      const write = await rw.writeLock({ ttl: 10_000 });
      const alsoRead = await rw.readLock({ ttl: 10_000 });
      assert.equal(alsoRead.fence, write.fence);
      assert.equal(alsoRead.owner, write.owner);
      assert.equal(await alsoRead.release(), 1, "the write side is still held");
      assert.equal((await locks.info(k))?.owner, write.owner);
      await write.releaseAll();
      assert.equal(await locks.info(k), null);
      // Another handle is another owner: it waits as any writer does.
      const other = locks.readWriteLock(k);
      const r2 = await rw.readLock({ ttl: 10_000 });
      await assert.rejects(other.writeLock({ ttl: 10_000, wait: 100 }), redislock.LockTimeoutError);
      await r2.release();
    });

    through("ioredis")("a wait of 2^31 ms and more waits, and a 30-day lease arms no timer in a spin", async () => {
      const k = key("long");
      const holder = await locks.lock(k, { ttl: 10_000 });
      const warnings: string[] = [];
      const onWarning = (w: Error) => warnings.push(w.name);
      process.on("warning", onWarning);
      try {
        let settled: string | null = null;
        const waiting = locks.lock(k, { ttl: 10_000, wait: 2 ** 31 });
        waiting.then(
          () => (settled = "granted"),
          (err: unknown) => (settled = String(err)),
        );
        await waitUntil("the waiter is queued", 2_000, async () => (await locks.info(k))?.waiters === 1);
        await new Promise((r) => setTimeout(r, 150));
        assert.equal(settled, null, "still waiting");
        await holder.release();
        const next = await waiting;
        assert.equal((await locks.info(k))?.owner, next.owner);
        await next.release();
        const month = 30 * 24 * 3_600_000;
        const cpu = process.cpuUsage();
        const long = await locks.lock(k, { ttl: month });
        const lw = await locks.lock(key("long-wait"), { ttl: 10_000, wait: 2 ** 40 });
        await new Promise((r) => setTimeout(r, 250));
        const used = process.cpuUsage(cpu);
        assert.equal(long.isLost, false);
        assert.ok(used.user + used.system < 150_000, `${(used.user + used.system) / 1000} ms of CPU in 300 ms`);
        assert.deepEqual(warnings, [], "no timer overflowed");
        await long.release();
        await lw.release();
      } finally {
        process.off("warning", onWarning);
      }
    });

    test("a key overwritten under a hold is a loss: renew rejects with the lost error, lost fires at once", async () => {
      const k = key("wrongtype");
      const lock = await locks.lock(k, { ttl: 10_000 });
      await admin.sendCommand(["SET", k, "x"]);
      await assert.rejects(lock.renew(), LockLostError);
      assert.equal(lock.isLost, true);
      assert.equal(lossReason(lock), "not-owner");
      // The watchdog sees it as well, long before the lease end.
      const k2 = key("wrongtype-dog");
      const dog = await locks.lock(k2, { ttl: 600 });
      await admin.sendCommand(["SET", k2, "x"]);
      await waitUntil("lost fires", 1_500, () => dog.isLost);
      assert.equal(lossReason(dog), "not-owner");
      await admin.sendCommand(["DEL", k, k2]);
    });

    through("node-redis")("a grant whose confirming renew finds it gone is no hold: lock() waits again", async () => {
      const k = key("regrant");
      const holder = await locks.lock(k, { ttl: 10_000 });
      // A wait longer than a third of the ttl: the grant is confirmed by a renew.
      const waiting = locks.lock(k, { ttl: 300, wait: 10_000 });
      await waitUntil("the waiter is queued", 2_000, async () => (await locks.info(k))?.waiters === 1);
      await new Promise((r) => setTimeout(r, 150));
      // Hand the lock to the waiter and take it away in one step: its
      // confirming renew finds NOTOWNER.
      await admin.multi().addCommand(["LOCK.RELEASE", k, holder.owner]).addCommand(["DEL", k]).exec();
      const lock = await waiting;
      assert.equal((await locks.info(k))?.owner, lock.owner, "the lock returned is held");
      assert.equal(lock.isLost, false);
      await lock.release();
      // Taken again at once by another owner: the call waits again, only
      // for what is left of its wait, and times out.
      const holder2 = await locks.lock(k, { ttl: 10_000 });
      const started = performance.now();
      const short = locks.lock(k, { ttl: 300, wait: 700 });
      await waitUntil("the waiter is queued", 2_000, async () => (await locks.info(k))?.waiters === 1);
      await new Promise((r) => setTimeout(r, 150));
      await admin
        .multi()
        .addCommand(["LOCK.RELEASE", k, holder2.owner])
        .addCommand(["DEL", k])
        .addCommand(["LOCK.ACQUIRE", k, "someone-else", "10000"])
        .exec();
      await assert.rejects(short, redislock.LockTimeoutError);
      const took = performance.now() - started;
      assert.ok(took > 600 && took < 1_500, `timed out after ${took} ms of a 700 ms wait`);
      assert.equal((await locks.info(k))?.owner, "someone-else");
      await admin.sendCommand(["DEL", k]);
    });

    through("ioredis")("a release that does not complete: the handle reports lost, the release lands later", async () => {
      const k = key("unconfirmed");
      const running = redislock.backgroundTasks();
      const lock = await locks.lock(k, { ttl: 30_000 });
      await admin.sendCommand(["CLIENT", "PAUSE", "400", "WRITE"]);
      const t = performance.now();
      await assert.rejects(lock.release({ signal: AbortSignal.timeout(100) }), LockAbortedError);
      assert.ok(performance.now() - t < 300, `rejected after ${performance.now() - t} ms`);
      assert.equal(lock.isLost, true);
      assert.equal(lossReason(lock), "release-unconfirmed");
      assert.equal(lock.count, 0);
      await waitUntil("the release lands after the pause", 3_000, async () => (await locks.info(k)) === null);
      await waitUntil("nothing left running", 2_000, () => redislock.backgroundTasks() === running);
    });

    through("node-redis")("the watchdog renews for the ttl a renew gave", async () => {
      const k = key("new-ttl");
      const lock = await locks.lock(k, { ttl: 30_000 });
      await lock.renew(150);
      await new Promise((r) => setTimeout(r, 400));
      const pttl = Number(await admin.sendCommand(["PTTL", k]));
      assert.ok(pttl > 0 && pttl <= 150, `PTTL ${pttl}`);
      assert.equal(lock.isHeld, true);
      await lock.release();
    });

    through("ioredis")("a cancel during the confirming renew of a long wait leaves nothing held", async () => {
      const k = key("cancel-confirm");
      const holder = await locks.lock(k, { ttl: 10_000 });
      const controller = new AbortController();
      const waiting = locks.lock(k, { ttl: 1_200, wait: 10_000, signal: controller.signal });
      await waitUntil("the waiter is queued", 2_000, async () => (await locks.info(k))?.waiters === 1);
      await new Promise((r) => setTimeout(r, 450));
      // The grant, then writes paused: the confirming renew is held up.
      await admin.multi().addCommand(["LOCK.RELEASE", k, holder.owner]).addCommand(["CLIENT", "PAUSE", "500", "WRITE"]).exec();
      const granted = performance.now();
      await new Promise((r) => setTimeout(r, 100));
      controller.abort();
      await assert.rejects(waiting, LockAbortedError);
      await waitUntil("freed once writes resume", 2_000, async () => (await locks.info(k)) === null);
      assert.ok(performance.now() - granted < 1_100, "freed by a release, not by its lease end");
    });

    test("renew with a new ttl, stop renewing, resume by owner token in another client", async () => {
      const k = key("handover");
      const lock = await locks.lock(k, { ttl: 2_000 });
      await lock.renew(20_000);
      const pttl = Number(await admin.sendCommand(["PTTL", k]));
      assert.ok(pttl > 19_000, `PTTL ${pttl}`);
      assert.equal(lock.ttl, 20_000);
      lock.stopRenewing();
      assert.equal(redislock.backgroundTasks() >= 1, true, "the deadline is still watched");
      // A worker elsewhere continues it by its owner token and fence.
      const conn = await lib.single(server);
      try {
        const worker = new LockClient(conn.transport);
        const resumed = await worker.resume(k, { owner: lock.owner, fence: lock.fence, ttl: 5_000 });
        assert.equal(resumed.fence, lock.fence);
        const ttl2 = Number(await admin.sendCommand(["PTTL", k]));
        assert.ok(ttl2 <= 5_000 && ttl2 > 4_000, `PTTL ${ttl2}`);
        assert.equal(await resumed.release(), 0);
        assert.equal(await locks.info(k), null);
        await assert.rejects(
          worker.resume(k, { owner: lock.owner, ttl: 5_000 }),
          redislock.LockNotHeldError,
          "nothing to resume once released",
        );
      } finally {
        await conn.close();
      }
      await assert.rejects(lock.renew(), LockLostError);
    });
  });
}

test("ioredis and node-redis: an abort that crosses the grant leaves the lock with nobody", { timeout: 60_000 }, async () => {
  for (const lib of LIBS) {
    const conn = await lib.single(server);
    const locks = new LockClient(conn.transport);
    try {
      let kept = 0;
      for (let i = 0; i < 10; i++) {
        const k = `${lib.name}:contract:cross-${i}`;
        const holder = await locks.lock(k, { ttl: 10_000 });
        const controller = new AbortController();
        const waiting = locks.lock(k, { ttl: 60_000, wait: 10_000, signal: controller.signal });
        waiting.then((l) => l.releaseAll()).catch(() => undefined);
        await waitUntil("the waiter is queued", 2_000, async () => (await locks.info(k))?.waiters === 1);
        // The abort first, then the release that hands the lock on: a
        // waiter still parked is granted the lock just after the abort.
        controller.abort();
        await holder.release();
        await new Promise((r) => setTimeout(r, 30));
        await waitUntil("the lock settles", 2_000, async () => ((await locks.info(k))?.waiters ?? 0) === 0);
        if ((await locks.info(k)) !== null) {
          kept++;
        }
      }
      assert.equal(kept, 0, `${lib.name}: ${kept} of 10 aborted waits left the lock held by nobody`);
    } finally {
      locks.close();
      await conn.close();
    }
  }
});

test("an abort of a wait the server postponed (writes paused) never sends it CLIENT UNBLOCK: the server lives", { timeout: 60_000 }, async () => {
  // Redis 7.0 crashes on a CLIENT UNBLOCK of a client whose command a
  // write pause postponed; an abort must wake only a wait the lock's queue
  // lists, never the release it queued behind it.
  const own = await Server.start();
  const control = createClient({ url: own.url });
  control.on("error", () => undefined);
  await control.connect();
  try {
    for (const lib of LIBS) {
      const conn = await lib.single(own);
      const locks = new LockClient(conn.transport);
      try {
        const k = `${lib.name}:contract:postponed`;
        const holder = await locks.lock(k, { ttl: 10_000 });
        const controller = new AbortController();
        const waiting = locks.lock(k, { ttl: 10_000, wait: 10_000, signal: controller.signal });
        await waitUntil("the waiter is queued", 2_000, async () => (await locks.info(k))?.waiters === 1);
        // Parked, then writes paused: whatever the abort sends on the wait's
        // connection after its wake-up (the release) is postponed.
        await control.sendCommand(["CLIENT", "PAUSE", "1500", "WRITE"]);
        controller.abort();
        await assert.rejects(waiting, LockAbortedError);
        // Give the background undo its time inside the pause.
        await new Promise((r) => setTimeout(r, 500));
        assert.equal(await control.sendCommand(["PING"]), "PONG", `${lib.name}: the server answers during the pause`);
        await waitUntil("the pause ends and nobody waits", 5_000, async () => ((await locks.info(k))?.waiters ?? 0) === 0);
        await holder.release();
        await waitUntil("the lock is free: the aborted wait holds nothing", 5_000, async () => (await locks.info(k)) === null);
        assert.equal(await control.sendCommand(["PING"]), "PONG", `${lib.name}: the server lives`);
      } finally {
        locks.close();
        await conn.close();
      }
    }
  } finally {
    control.destroy();
    await own.stop();
  }
});
