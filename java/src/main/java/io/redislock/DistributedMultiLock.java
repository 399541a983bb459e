package io.redislock;

import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.Lock;

/**
 * A {@link Lock} on several keys at once, in the place of Redisson's
 * {@code RedissonMultiLock}, but taken by the server in one step, all or
 * none: a wait queues on every key as one request and is granted when all of
 * them can be granted together, never some while it waits. So two
 * {@code DistributedMultiLock}s on the same keys in any order never deadlock,
 * and no request that came later takes any of the keys first (first come,
 * first served across keys, which retrying one lock after another cannot
 * give).
 *
 * <p>Per thread, as {@link DistributedLock}: a thread's hold is one
 * {@link Hold} on every key (one watchdog renewing them all with one
 * {@code LOCK.MRENEW}, lost when any key is lost); a thread that locks again
 * counts up locally, and its last {@link #unlock()} releases every key.
 * {@link #unlock()} from a thread that does not hold it throws
 * {@link IllegalMonitorStateException}. Without a lease the hold has a 30 s
 * lease renewed by the watchdog; an interrupt while waiting leaves no key
 * held.
 */
public final class DistributedMultiLock implements Lock {
  private final LockClient client;
  private final HoldKind kind;
  private final ConcurrentHashMap<Thread, Entry> held = new ConcurrentHashMap<>();

  /** A thread's hold and how many times it locked. */
  private static final class Entry {
    final Hold hold;
    int count = 1;

    Entry(Hold hold) {
      this.hold = hold;
    }
  }

  DistributedMultiLock(LockClient client, HoldKind kind) {
    this.client = client;
    this.kind = kind;
  }

  /** The keys, in the order given. */
  public List<String> getKeys() {
    return kind.keys();
  }

  /**
   * Takes every key with {@code opts} as the calling thread (a local count
   * if it holds them already): the general form of the methods here.
   */
  public Hold acquire(LockOptions opts) throws InterruptedException {
    return take(opts, true);
  }

  private Hold take(LockOptions opts, boolean interruptible) throws InterruptedException {
    Entry mine = held.get(Thread.currentThread());
    if (mine != null && mine.hold.isHeld()) {
      mine.count++;
      return mine.hold;
    }
    Hold h = client.acquire(kind.keys().get(0), client.newOwner(), kind, opts, interruptible);
    held.put(Thread.currentThread(), new Entry(h));
    return h;
  }

  /** The calling thread's hold, or null. */
  public Hold getHold() {
    Entry mine = held.get(Thread.currentThread());
    return mine == null ? null : mine.hold;
  }

  /** Whether the calling thread holds every key (not released, not lost). */
  public boolean isHeldByCurrentThread() {
    Hold h = getHold();
    return h != null && h.isHeld();
  }

  @Override
  public void lock() {
    try {
      take(LockOptions.defaults().waitForever(), false);
    } catch (InterruptedException e) {
      // Not thrown when not interruptible; keep the flag all the same.
      Thread.currentThread().interrupt();
    }
  }

  @Override
  public void lockInterruptibly() throws InterruptedException {
    take(LockOptions.defaults().waitForever(), true);
  }

  @Override
  public boolean tryLock() {
    try {
      take(LockOptions.defaults(), false);
      return true;
    } catch (WouldBlockException | QuarantineException e) {
      return false;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return false;
    }
  }

  @Override
  public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
    LockOptions opts = LockOptions.defaults()
        .waitMs(Math.min(unit.toMillis(Math.max(0, time)), LockOptions.MAX_MS));
    try {
      take(opts, true);
      return true;
    } catch (WouldBlockException | LockTimeoutException | QuarantineException e) {
      return false;
    }
  }

  /**
   * Undoes one lock of the calling thread; the last releases every key
   * ({@code LOCK.MRELEASE}). A hold lost meanwhile throws its
   * {@link LockLostException} after it is forgotten.
   */
  @Override
  public void unlock() {
    Thread me = Thread.currentThread();
    Entry mine = held.get(me);
    if (mine == null) {
      throw new IllegalMonitorStateException("the current thread does not hold " + kind.keys());
    }
    if (--mine.count > 0) {
      return;
    }
    held.remove(me);
    try {
      mine.hold.releaseAll();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /** Not supported: a condition would need the keys released and taken again as one. */
  @Override
  public Condition newCondition() {
    throw new UnsupportedOperationException("a DistributedMultiLock has no conditions");
  }
}
