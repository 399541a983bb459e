package io.redislock;

import java.util.concurrent.locks.ReadWriteLock;

/**
 * A {@link ReadWriteLock} on one key: the read side is a shared hold
 * ({@code SHARED}), the write side an exclusive one, both under the calling
 * thread's one owner token. A writer may read (a reentry of its write hold);
 * a reader asking to write is refused at once with
 * {@link UpgradeRefusedException} (two upgrading readers would wait on each
 * other for ever). The server serves readers and writers first come, first
 * served: a waiting writer is not starved by a stream of readers.
 */
public final class DistributedReadWriteLock implements ReadWriteLock {
  private final DistributedLock read;
  private final DistributedLock write;

  DistributedReadWriteLock(ThreadOwners owners) {
    this.read = new DistributedLock(owners, HoldKind.SHARED);
    this.write = new DistributedLock(owners, HoldKind.EXCLUSIVE);
  }

  @Override
  public DistributedLock readLock() {
    return read;
  }

  @Override
  public DistributedLock writeLock() {
    return write;
  }
}
