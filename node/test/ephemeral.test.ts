/** Ephemeral holds through both client libraries: a connection of their own, kept for the hold. */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { InvalidOptionsError, LockLostError, WouldBlockError } from "../src/index.js";
import { LIBS, connectedClient } from "./libs.js";
import { Server, waitUntil } from "./servers.js";

let server: Server;
before(async () => {
  server = await Server.start();
});
after(async () => {
  await server.stop();
});

/** Ids of the connections whose last command was `LOCK.ACQUIRE`. */
async function acquirers(): Promise<string[]> {
  const list = await server.cmd("CLIENT", "LIST");
  return list
    .split("\n")
    .filter((line) => line.includes("cmd=lock.acquire"))
    .map((line) => /id=(\d+)/.exec(line)?.[1] ?? "");
}

for (const lib of LIBS) {
  describe(lib.name, () => {
    const locks = connectedClient(() => lib.single(server));
    const key = (name: string) => `${lib.name}:${name}`;

    test("a closed hold connection ends the hold at once and fires lost", async () => {
      const k = key("closed");
      const lock = await locks.lock(k, { ttl: 30_000, ephemeral: true });
      const info = await locks.info(k);
      assert.equal(info?.holders[0]?.owner, lock.owner);
      const ids = await acquirers();
      assert.equal(ids.length, 1, `one hold connection: ${ids.join(",")}`);
      await server.cmd("CLIENT", "KILL", "ID", ids[0] as string);
      await waitUntil("lost fires", 2_000, () => lock.isLost);
      assert.ok(lock.lost.reason instanceof LockLostError);
      assert.equal((lock.lost.reason as LockLostError).reason, "disconnected");
      assert.equal(await locks.info(k), null, "ended at once, not at the 30 s lease end");
    });

    test("release closes the hold's connection and reports no loss", async () => {
      const k = key("release");
      for (let i = 0; i < 3; i++) {
        const lock = await locks.lock(k, { ttl: 10_000, ephemeral: true });
        assert.equal(await lock.release(), 0);
        assert.equal(await locks.info(k), null);
        assert.equal(lock.isLost, false);
      }
      await waitUntil("no hold connection left", 2_000, async () => (await acquirers()).length === 0);
    });

    test("an ephemeral try on a held lock: WouldBlockError; options checked", async () => {
      const k = key("try");
      const holder = await locks.lock(k, { ttl: 10_000 });
      await assert.rejects(locks.tryLock(k, { ephemeral: true }), WouldBlockError);
      await holder.release();
      await assert.rejects(locks.lock(k, { ephemeral: "yes" as unknown as boolean }), InvalidOptionsError);
    });
  });
}
