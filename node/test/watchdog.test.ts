/** The watchdog's loss signal when the server stops answering: `CLIENT PAUSE` and `CLIENT KILL`. */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { createClient } from "redis";
import { LockLostError } from "../src/index.js";
import { LIBS, connectedClient } from "./libs.js";
import { Server, waitUntil } from "./servers.js";

let server: Server;
before(async () => {
  server = await Server.start();
});
after(async () => {
  await server.stop();
});

/** Resolves with the time the signal fired. */
const firing = (signal: AbortSignal): Promise<number> =>
  new Promise((resolve) => signal.addEventListener("abort", () => resolve(performance.now()), { once: true }));

for (const lib of LIBS) {
  describe(lib.name, () => {
    const locks = connectedClient(() => lib.single(server));
    const key = (name: string) => `${lib.name}:${name}`;

    test("CLIENT PAUSE longer than the lease: lost fires by the local deadline", async () => {
      const ttl = 240;
      const lock = await locks.lock(key("paused"), { ttl });
      const lost = firing(lock.lost);
      const paused = performance.now();
      assert.equal(await server.cmd("CLIENT", "PAUSE", "700", "ALL"), "+OK");
      const at = await lost;
      assert.equal((lock.lost.reason as LockLostError).reason, "expired");
      // The last renew was sent at most a third of the lease before the pause.
      assert.ok(at - paused <= ttl + 100 && at - lock.deadline < 100, `lost ${at - paused} ms into the pause`);
      await waitUntil("the pause is over", 2_000, async () => (await server.cmd("PING")) === "+PONG");
      await lock.releaseAll().catch(() => undefined);
    });

    test("one CLIENT KILL: the client reconnects and the watchdog keeps the lock", async () => {
      const lock = await locks.lock(key("killed-once"), { ttl: 300 });
      const renewed = await server.infoInt("lock", "lock_renewed");
      assert.match(await server.cmd("CLIENT", "KILL", "TYPE", "normal"), /^:[1-9]/);
      await waitUntil("two renews after the kill", 2_000, async () =>
        (await server.infoInt("lock", "lock_renewed")) >= renewed + 2,
      );
      assert.equal(lock.isLost, false);
      assert.equal(await lock.release(), 0);
    });

    test("CLIENT KILL again and again: lost fires while the server still holds the lease", async () => {
      const ttl = 300;
      // One admin connection for the kills (it skips itself) and the check.
      const admin = createClient({ url: server.url });
      await admin.connect();
      const lock = await locks.lock(key("killed"), { ttl });
      // Asked the moment the loss fires, on the open admin connection.
      let leaseLeft: Promise<number> | null = null;
      lock.lost.addEventListener("abort", () => {
        leaseLeft = admin.pTTL(key("killed"));
      });
      const lost = firing(lock.lost);
      const started = performance.now();
      while (!lock.isLost && performance.now() - started < 3_000) {
        await admin.sendCommand(["CLIENT", "KILL", "TYPE", "normal"]);
        await new Promise((r) => setTimeout(r, 2));
      }
      const at = await lost;
      const left = await (leaseLeft as Promise<number> | null);
      admin.destroy();
      assert.ok(left !== null && left > 0, `the server's lease had ${left} ms left when the loss fired`);
      assert.equal((lock.lost.reason as LockLostError).reason, "expired");
      // A renew may slip through between two kills; the loss comes at the
      // deadline of the last one that did (timers may fire a fraction of a
      // millisecond early, which only makes the loss more cautious).
      assert.ok(at - lock.deadline > -2 && at - lock.deadline < 100, `lost ${at - lock.deadline} ms past the deadline`);
      await lock.releaseAll().catch(() => undefined);
    });
  });
}
