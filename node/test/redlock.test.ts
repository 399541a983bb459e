/** Redlock over independent servers: majority, fence round, cancellation, kills and pauses. */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  InvalidOptionsError,
  LockAbortedError,
  LockLostError,
  NoQuorumError,
  Redlock,
  type Transport,
} from "../src/index.js";
import * as redislock from "../src/index.js";
import { LIBS, type Connected } from "./libs.js";
import { Server, waitUntil } from "./servers.js";

const exists = async (server: Server, key: string) => (await server.cmd("EXISTS", key)) === ":1";

test("Redlock needs an odd number of servers, at least 3, and checks its options", () => {
  const t = {} as Transport;
  assert.throws(() => new Redlock([t, t]), (e: unknown) => e instanceof InvalidOptionsError && /odd number/.test(e.message));
  assert.throws(() => new Redlock([t, t, t, t]), InvalidOptionsError);
  assert.throws(() => new Redlock([t, t, t], { serverTimeout: 0 }), /serverTimeout must be a positive/);
  assert.throws(() => new Redlock([t, t, t], { retries: 3 } as object), /unknown Redlock option 'retries'/);
  assert.equal(new Redlock([t, t, t, t, t]).quorum, 3);
});

for (const lib of LIBS) {
  describe(lib.name, () => {
    let servers: Server[];
    let conns: Connected[];
    let redlock: Redlock;
    before(async () => {
      servers = await Promise.all([0, 1, 2].map(() => Server.start()));
      conns = await Promise.all(servers.map((s) => lib.single(s)));
      redlock = new Redlock(conns.map((c) => c.transport));
    });
    after(async () => {
      await Promise.all(conns.map((c) => c.close()));
      await Promise.all(servers.map((s) => s.stop()));
    });

    test("ephemeral is refused with a clear error, and nothing is held", async () => {
      for (const take of [
        () => redlock.lock("eph", { ttl: 10_000, ephemeral: true }),
        () => redlock.tryLock("eph", { ttl: 10_000, ephemeral: true }),
      ]) {
        await assert.rejects(take(), (err: unknown) => {
          assert.ok(err instanceof redislock.LockRefusedError, String(err));
          assert.match(err.message, /ephemeral/);
          return true;
        });
      }
      for (const server of servers) {
        assert.equal(await exists(server, "eph"), false);
      }
    });

    test("a majority grants; every method works; the release frees every server", async () => {
      // Server 2 is taken by someone else: 2 of 3 is a majority.
      await servers[2]!.cmd("LOCK.ACQUIRE", "res", "blocker", "60000");
      const lock = await redlock.lock("res", { ttl: 10_000 });
      assert.equal(typeof lock.fence, "bigint");
      assert.ok(await exists(servers[0]!, "res"));
      assert.equal(await lock.reenter(), 2);
      await lock.renew();
      assert.equal(await lock.release(), 1);
      assert.equal(await lock.release(), 0);
      assert.equal(await exists(servers[0]!, "res"), false);
      assert.equal(await exists(servers[1]!, "res"), false);
      await servers[2]!.cmd("LOCK.RELEASE", "res", "blocker");
      // Two taken: no majority, and the one server that granted is released.
      await servers[0]!.cmd("LOCK.ACQUIRE", "res2", "blocker", "60000");
      await servers[1]!.cmd("LOCK.ACQUIRE", "res2", "blocker", "60000");
      await assert.rejects(redlock.tryLock("res2", { ttl: 10_000 }), NoQuorumError);
      assert.equal(await exists(servers[2]!, "res2"), false);
      const started = performance.now();
      await assert.rejects(redlock.lock("res2", { ttl: 10_000, wait: 150 }), /before the wait ended/);
      assert.ok(performance.now() - started < 1_000);
      const value = await redlock.using("res3", { ttl: 5_000 }, async (signal) => (signal.aborted ? 0 : 7));
      assert.equal(value, 7);
      assert.equal(await exists(servers[0]!, "res3"), false);
    });

    test("the fence round makes fences rise from holder to holder", async () => {
      // Server 0's counter runs half an hour ahead, as a server whose clock
      // is ahead would. A gets {0, 1}, so its fence comes from server 0; B
      // gets {1, 2}. Without the round B's fence is below A's.
      const ahead = (BigInt(Date.now()) + 1_800_000n) << 10n;
      await servers[0]!.cmd("LOCK.ACQUIRE", "scratch", "x", "60000");
      await servers[0]!.cmd("LOCK.FENCE", "scratch", "x", ahead.toString());
      await servers[0]!.cmd("LOCK.RELEASE", "scratch", "x");
      const run = async (skip: boolean): Promise<[bigint, bigint]> => {
        const rl = new Redlock(conns.map((c) => c.transport));
        rl.skipFenceRoundForTests = skip;
        const key = `resource-${skip}`;
        await servers[2]!.cmd("LOCK.ACQUIRE", key, "blocker", "60000");
        const a = await rl.tryLock(key, { ttl: 10_000 });
        await a.releaseAll();
        await servers[2]!.cmd("LOCK.RELEASE", key, "blocker");
        await servers[0]!.cmd("LOCK.ACQUIRE", key, "blocker", "60000");
        const b = await rl.tryLock(key, { ttl: 10_000 });
        await b.releaseAll();
        await servers[0]!.cmd("LOCK.RELEASE", key, "blocker");
        return [a.fence, b.fence];
      };
      const [a0, b0] = await run(true);
      assert.ok(a0 >= ahead, "A's fence came from the server ahead");
      assert.ok(b0 < a0, `without the round B's fence ${b0} is below A's ${a0}`);
      const [a1, b1] = await run(false);
      assert.ok(b1 > a1, `with the round B's fence ${b1} is above A's ${a1}`);
    });

    test("an aborted lock releases on every server, grants in flight included", async () => {
      // Server 1 is paused: its grant comes after the abort.
      servers[1]!.suspend();
      try {
        const controller = new AbortController();
        const pending = redlock.lock("aborted", { ttl: 60_000, signal: controller.signal });
        setTimeout(() => controller.abort(), 5);
        await assert.rejects(pending, LockAbortedError);
      } finally {
        servers[1]!.resume();
      }
      await waitUntil("no server holds the lock", 2_000, async () => {
        for (const s of servers) {
          if (await exists(s, "aborted")) {
            return false;
          }
        }
        return true;
      });
    });

    test("a killed server: the majority keeps the lock; a second loss ends it", async () => {
      const lock = await redlock.lock("killed", { ttl: 600 });
      await servers[2]!.kill();
      await lock.renew();
      const other = await redlock.tryLock("killed-2", { ttl: 600 });
      await other.releaseAll();
      servers[1]!.suspend();
      try {
        const reason = await new Promise<LockLostError>((resolve) =>
          lock.lost.addEventListener("abort", () => resolve(lock.lost.reason as LockLostError), { once: true }),
        );
        assert.equal(reason.reason, "expired");
      } finally {
        servers[1]!.resume();
        await servers[2]!.startAgain();
      }
      await lock.releaseAll().catch(() => undefined);
    });
  });
}

/**
 * Workers of both libraries take one lock through Redlock and write to a
 * store that keeps the highest fence it has seen and refuses lower ones; one
 * worker sometimes sleeps past its lease (watchdog off) before writing again.
 * Meanwhile servers are killed and restarted, or paused. The AOF is fsynced
 * at every write and `lock.max-ttl` is on, as recommended for Redlock.
 */
test("Redlock under kills and pauses: fences rise and no stale write is accepted", async () => {
  const MAX_TTL = 1_000;
  const servers = await Promise.all(
    [0, 1, 2].map(() =>
      Server.start({ config: { appendonly: "yes", appendfsync: "always", "lock.max-ttl": String(MAX_TTL) } }),
    ),
  );
  for (const s of servers) {
    await waitUntil("the start-up quarantine is over", 5_000, async () => (await s.infoInt("lock", "lock_quarantine_ms")) === 0);
  }
  const conns: Connected[] = [];
  const store = {
    highest: 0n,
    accepted: [] as Array<[string, bigint]>,
    refused: 0,
    claims: [] as bigint[],
    write(owner: string, fence: bigint, first: boolean): boolean {
      if (fence < this.highest) {
        this.refused++;
        return false;
      }
      if (first) {
        this.claims.push(fence);
      }
      this.highest = fence;
      this.accepted.push([owner, fence]);
      return true;
    },
  };
  let stop = false;
  let holdings = 0;
  const workers: Array<Promise<void>> = [];
  for (let w = 0; w < 4; w++) {
    const lib = LIBS[w % LIBS.length]!;
    const mine = await Promise.all(servers.map((s) => lib.single(s)));
    conns.push(...mine);
    const redlock = new Redlock(mine.map((c) => c.transport));
    const sleeper = w === 0;
    const ttl = sleeper ? 300 : 800;
    workers.push(
      (async () => {
        let round = 0;
        while (!stop) {
          let lock;
          try {
            lock = await redlock.lock("resource", { ttl, wait: 1_000, watchdog: !sleeper });
          } catch {
            continue;
          }
          round++;
          for (let i = 0; i < 3; i++) {
            if (sleeper && round % 3 === 0 && i === 1) {
              // A paused holder: past its lease, then it writes.
              await new Promise((r) => setTimeout(r, ttl * 2));
            }
            store.write(lock.owner, lock.fence, i === 0);
            await new Promise((r) => setTimeout(r, 2));
          }
          holdings++;
          await lock.releaseAll().catch(() => undefined);
        }
      })(),
    );
  }
  let events = 0;
  while (events < 9) {
    await new Promise((r) => setTimeout(r, 400));
    const victim = servers[events % servers.length]!;
    if (events % 2 === 0) {
      await victim.kill();
      await new Promise((r) => setTimeout(r, 150));
      await victim.startAgain();
    } else {
      await victim.cmd("CLIENT", "PAUSE", "300", "WRITE");
    }
    events++;
  }
  stop = true;
  await Promise.all(workers);
  await Promise.all(conns.map((c) => c.close()));
  await Promise.all(servers.map((s) => s.stop()));

  // Every holder's accepted writes form one run: no stale write slipped in
  // after another holder's; fences rise between runs and between claims.
  const done = new Set<string>();
  let runs = 0;
  for (let i = 1; i < store.accepted.length; i++) {
    const [a, fa] = store.accepted[i - 1]!;
    const [b, fb] = store.accepted[i]!;
    if (a !== b) {
      assert.ok(fb > fa, `fence fell from ${fa} (${a}) to ${fb} (${b})`);
      assert.ok(!done.has(a), `a stale write by ${a} was accepted`);
      done.add(a);
      assert.ok(!done.has(b), `a stale write by ${b} was accepted`);
      runs++;
    }
  }
  for (let i = 1; i < store.claims.length; i++) {
    assert.ok(store.claims[i]! > store.claims[i - 1]!, "claims rise");
  }
  console.log(
    `redlock 3 servers: ${holdings} holdings, ${runs} holder changes, ${store.accepted.length} writes accepted, ` +
      `${store.refused} stale writes refused, ${events} kills/pauses`,
  );
  assert.ok(holdings >= 20, `only ${holdings} holdings`);
});
