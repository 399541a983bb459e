/**
 * Node.js client for the `redislock` module (distributed locks inside
 * `redis-server`): locks with exact `bigint` fences, a watchdog with a loss
 * signal, waits served first come first served by the server, and Redlock
 * over several servers with fences that rise from holder to holder.
 *
 * | file | what lives there |
 * |---|---|
 * | `client.ts` | `LockClient`: one server or a Redis Cluster; `ReadWriteLock`, `Semaphore`, `resume` |
 * | `redlock.ts` | `Redlock`: N independent servers, majority, fence round |
 * | `lock.ts` | `Lock`, its lease deadline, loss signal and watchdog |
 * | `background.ts` | timers armed in steps past 2^31 ms; the count of what runs in the background |
 * | `options.ts` | `LockOptions`, their checks, drift and renew timing |
 * | `errors.ts` | the error classes |
 * | `transport.ts` | what an adapter provides; reply helpers |
 * | `node-redis.ts`, `ioredis.ts` | the adapters (their own entry points) |
 */

export { type HolderInfo, LockClient, type LockInfo, ReadWriteLock, type ResumeOptions, Semaphore } from "./client.js";
export { Redlock, type RedlockOptions } from "./redlock.js";
export { Lock } from "./lock.js";
export { type LockOptions, type ReleaseOptions, drift } from "./options.js";
export { backgroundTasks } from "./background.js";
export type { Link, Reply, Transport } from "./transport.js";
export {
  InvalidOptionsError,
  LimitMismatchError,
  LockAbortedError,
  LockError,
  LockLostError,
  LockNotHeldError,
  LockRefusedError,
  LockTimeoutError,
  type LossReason,
  ModuleNotLoadedError,
  NoQuorumError,
  QuarantineError,
  UpgradeError,
  WouldBlockError,
} from "./errors.js";
