// The part of redlock 4.x (plain JavaScript, no types) the bench uses.
declare module "redlock" {
  interface Lock {
    /** How many times the lock script ran for this lock (1 = no retry). */
    readonly attempts: number;
    unlock(): Promise<void>;
  }
  interface Options {
    retryCount?: number;
    retryDelay?: number;
    retryJitter?: number;
    driftFactor?: number;
  }
  class Redlock {
    constructor(clients: unknown[], options?: Options);
    /** An array of resources is one lock on all of them: one script sets every key or none. */
    lock(resource: string | string[], ttl: number): Promise<Lock>;
  }
  export default Redlock;
}
