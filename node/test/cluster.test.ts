/**
 * Redis Cluster through both libraries' cluster clients: every method over
 * keys on every master, and waits that follow `ASK` (their lock migrated
 * while they waited) and `MOVED` (a client whose slot map is stale).
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { LockClient, LockNotHeldError, WouldBlockError } from "../src/index.js";
import { slotOf } from "../src/transport.js";
import { LIBS, connectedClient } from "./libs.js";
import { type Server, startCluster, waitUntil } from "./servers.js";

let nodes: Server[];
before(async () => {
  nodes = await startCluster();
});
after(async () => {
  await Promise.all(nodes.map((n) => n.stop()));
});

/** The node serving `key` now: the one that does not redirect. */
async function owner(key: string): Promise<Server> {
  for (const node of nodes) {
    if (!(await node.cmd("LOCK.INFO", key)).startsWith("-MOVED")) {
      return node;
    }
  }
  throw new Error(`no node serves ${key}`);
}

async function myId(node: Server): Promise<string> {
  const line = (await node.cmd("CLUSTER", "NODES")).split("\n").find((l) => l.includes("myself"));
  return (line ?? "").split(" ")[0] ?? "";
}

async function errorstat(node: Server, kind: string): Promise<number> {
  const found = new RegExp(`^errorstat_${kind}:count=(\\d+)`, "m").exec(await node.cmd("INFO", "errorstats"));
  return found ? Number(found[1]) : 0;
}

const waiters = async (node: Server): Promise<number> => node.infoInt("lock", "lock_waiting");

test("the client's slot of a key is the server's CLUSTER KEYSLOT", async () => {
  const keys = ["foo", "{}foo", "foo{}{bar}", "{user1000}.following", "a{b}c", "{{x}}", "ключ", "", "{"];
  for (let i = 0; i < 40; i++) {
    keys.push(`k${i}:${Math.random().toString(36)}`);
  }
  for (const key of keys) {
    assert.equal(`:${slotOf(key)}`, await nodes[0]!.cmd("CLUSTER", "KEYSLOT", key), JSON.stringify(key));
  }
});

for (const lib of LIBS) {
  describe(lib.name, () => {
    const locks = connectedClient(() => lib.cluster(nodes));

    test("every method, on keys served by every master", async () => {
      const keys = Array.from({ length: 12 }, (_, i) => `${lib.name}:k${i}`);
      const served = new Set(await Promise.all(keys.map(async (k) => (await owner(k)).port)));
      assert.equal(served.size, 3, "the keys spread over the three masters");
      const moved = async () => (await Promise.all(nodes.map((n) => errorstat(n, "MOVED")))).reduce((a, b) => a + b, 0);
      const movedBefore = await moved();
      for (const key of keys) {
        const lock = await locks.lock(key, { ttl: 10_000 });
        assert.equal((await locks.info(key))?.fence, lock.fence);
        await assert.rejects(locks.tryLock(key), WouldBlockError);
        assert.equal(await lock.reenter(), 2);
        await lock.renew();
        assert.equal(await lock.release(), 1);
        const waiting = locks.lock(key, { ttl: 10_000, wait: 5_000 });
        await waitUntil("the waiter is queued", 2_000, async () => (await locks.info(key))?.waiters === 1);
        assert.equal(await lock.release(), 0);
        const next = await waiting;
        assert.ok(next.fence > lock.fence);
        await next.releaseAll();
        await assert.rejects(next.renew(), LockNotHeldError);
        assert.equal(await locks.using(key, { ttl: 1_000 }, () => "ok"), "ok");
        assert.equal(await locks.info(key), null);
      }
      assert.equal(await moved(), movedBefore, "every command went straight to the node serving its key");
    });

    test("a wait follows ASK when its lock migrates, and MOVED from a stale slot map", async () => {
      const stale = await lib.cluster(nodes);
      try {
        const staleLocks = new LockClient(stale.transport);
        const tag = `{mig-${lib.name}}`;
        const one = `${tag}:one`;
        const two = `${tag}:two`;
        const slot = slotOf(one);
        const source = await owner(one);
        const target = nodes.find((n) => n !== source)!;
        // The stale client learns the slot map now, before the migration.
        assert.equal(await staleLocks.info(two), null);

        const holder = await locks.lock(one, { ttl: 30_000 });
        const waiting = locks.lock(one, { ttl: 30_000, wait: 10_000 });
        await waitUntil("the waiter is queued on the source", 2_000, async () => (await waiters(source)) === 1);

        const [sourceId, targetId] = await Promise.all([myId(source), myId(target)]);
        const asksBefore = await errorstat(source, "ASK");
        assert.equal(await target.cmd("CLUSTER", "SETSLOT", String(slot), "IMPORTING", sourceId), "+OK");
        assert.equal(await source.cmd("CLUSTER", "SETSLOT", String(slot), "MIGRATING", targetId), "+OK");
        assert.equal(await source.cmd("MIGRATE", "127.0.0.1", String(target.port), "", "0", "5000", "KEYS", one), "+OK");
        // The source answers its waiter -ASK; the client asks the target.
        await waitUntil("the waiter waits on the target", 2_000, async () => (await waiters(target)) === 1);
        assert.equal(await waiters(source), 0);
        assert.ok((await errorstat(source, "ASK")) > asksBefore, "the wait was redirected by ASK");
        for (const node of [target, source, ...nodes.filter((n) => n !== source && n !== target)]) {
          assert.equal(await node.cmd("CLUSTER", "SETSLOT", String(slot), "NODE", targetId), "+OK");
        }
        // The release goes through the cluster client, which follows MOVED.
        assert.equal(await holder.release(), 0);
        const next = await waiting;
        assert.ok(next.fence > holder.fence);
        assert.equal((await locks.info(one))?.owner, next.owner);
        await next.release();

        // A client that still thinks the slot is on the source.
        const blocker = await locks.lock(two, { ttl: 30_000 });
        const movedBefore = await errorstat(source, "MOVED");
        const late = staleLocks.lock(two, { ttl: 30_000, wait: 10_000 });
        await waitUntil("the stale client's waiter waits on the target", 2_000, async () => (await waiters(target)) === 1);
        assert.ok((await errorstat(source, "MOVED")) > movedBefore, "the wait was redirected by MOVED");
        await blocker.release();
        const got = await late;
        assert.ok(got.fence > blocker.fence);
        await got.release();
        assert.equal(await locks.info(two), null);
      } finally {
        await stale.close();
      }
    });
  });
}
