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

    test("CLIENT KILL, then no way back in: lost fires while the server still holds the lease", async () => {
      const ttl = 300;
      // One admin connection, authenticated before the default user gets a
      // password: it runs the kill (skipping itself), the check and the
      // clean-up. The lock's client reconnects after the kill but every
      // command it sends is refused (NOAUTH), so no renewal gets through,
      // however the kill and the reconnection interleave.
      const admin = createClient({ url: server.url });
      await admin.connect();
      const lock = await locks.lock(key("killed"), { ttl });
      const lost = firing(lock.lost);
      try {
        await admin.sendCommand(["ACL", "SETUSER", "default", "resetpass", ">watchdog-test"]);
        assert.match(String(await admin.sendCommand(["CLIENT", "KILL", "TYPE", "normal"])), /^[1-9]/);
        // No renewal gets through from now on: the server's lease end is fixed.
        const serverEnd = Number(await admin.sendCommand(["PEXPIRETIME", key("killed")]));
        const at = await Promise.race([
          lost,
          new Promise<number>((_, reject) =>
            setTimeout(() => reject(new Error("lost did not fire within 3 s of the kill")), 3_000),
          ),
        ]);
        // The client's deadline, on the wall clock, comes before the
        // server's lease end: it declares the loss while the server still
        // holds the lease (whatever the event loop's lateness in firing it).
        const wallDeadline = Date.now() - performance.now() + lock.deadline;
        assert.ok(wallDeadline < serverEnd, `the deadline is ${wallDeadline - serverEnd} ms past the server's lease end`);
        assert.equal((lock.lost.reason as LockLostError).reason, "expired");
        // The loss comes at the local deadline of the last renewal that got
        // through (timers may fire a fraction of a millisecond early, which
        // only makes the loss more cautious).
        assert.ok(at - lock.deadline > -2 && at - lock.deadline < 100, `lost ${at - lock.deadline} ms past the deadline`);
      } finally {
        await admin.sendCommand(["ACL", "SETUSER", "default", "nopass"]);
        admin.destroy();
      }
      await lock.releaseAll().catch(() => undefined);
    });
  });
}
