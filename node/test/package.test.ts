/** The published builds (ESM, CommonJS, declarations) and the pure helpers. */

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { test } from "node:test";
import { drift } from "../src/index.js";
import { check } from "../src/options.js";
import { slotOf, toBigInt } from "../src/transport.js";

test("the package loads as ESM and as CommonJS, each entry point with its declarations", async () => {
  const require = createRequire(import.meta.url);
  for (const entry of ["redislock-client", "redislock-client/node-redis", "redislock-client/ioredis"]) {
    const esm = (await import(entry)) as Record<string, unknown>;
    const cjs = require(entry) as Record<string, unknown>;
    assert.deepEqual(Object.keys(esm).sort(), Object.keys(cjs).sort(), entry);
    assert.ok(Object.keys(esm).length > 0, entry);
  }
  const cjs = require("redislock-client") as typeof import("../src/index.js");
  assert.equal(typeof cjs.LockClient, "function");
  assert.ok(new cjs.LockLostError("expired") instanceof cjs.LockError);
  for (const name of ["index", "node-redis", "ioredis"]) {
    assert.ok(existsSync(new URL(`../../dist/types/${name}.d.ts`, import.meta.url)), name);
  }
});

test("cluster slots: CRC16 of the key or of its hash tag", () => {
  // Values from the Redis Cluster specification and CLUSTER KEYSLOT.
  assert.equal(slotOf("123456789"), 0x31c3 % 16384);
  assert.equal(slotOf("foo"), 12182);
  assert.equal(slotOf("{user1000}.following"), slotOf("{user1000}.followers"));
  assert.equal(slotOf("foo{}{bar}"), slotOf("foo{}{bar}"));
  assert.equal(slotOf("{}foo"), 9500);
});

test("integers are read from their digits, never through Number", () => {
  assert.equal(toBigInt("1882602652756344833"), 1882602652756344833n);
  assert.throws(() => toBigInt(1882602652756344833 as unknown as string), /as strings/);
  assert.throws(() => toBigInt(null), TypeError);
});

test("defaults and timing rules match the Rust client's", () => {
  const opts = check(undefined);
  assert.equal(opts.ttl, 30_000);
  assert.equal(opts.wait, 30_000);
  assert.equal(opts.watchdog, true);
  assert.equal(check({ wait: Infinity }).wait, null);
  assert.equal(drift(10_000), 102);
});
