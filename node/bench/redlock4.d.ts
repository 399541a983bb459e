// The part of redlock 4.x (plain JavaScript, no types) the bench uses.
declare module "redlock" {
  interface Lock {
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
    lock(resource: string, ttl: number): Promise<Lock>;
  }
  export default Redlock;
}
