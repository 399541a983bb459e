package io.redislock;

import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.Lock;

/**
 * A {@link Lock} on one key, reentrant per thread as Redisson's {@code RLock}:
 * the owner token is the thread's, a thread that holds it again counts up
 * (on the server: {@code LOCK.REENTER}), and {@link #unlock()} from a thread
 * that does not hold it throws {@link IllegalMonitorStateException}.
 *
 * <p>Without a lease ({@link #lock()}, {@link #tryLock()} …) the hold has a
 * 30 s lease that a watchdog renews every 10 s until unlocked; with a lease
 * ({@link #lock(long, TimeUnit)}, {@link #tryLock(long, long, TimeUnit)}) it ends
 * then, with no watchdog. Waits are parked in the server (first come, first
 * served) on a dedicated connection. An interrupt at any point of
 * {@link #lockInterruptibly()} or {@link #tryLock(long, TimeUnit)} leaves no
 * hold and no watchdog.
 */
public class DistributedLock implements Lock {
  private final LockClient client;
  private final String name;
  private final ThreadOwners owners;
  private final HoldKind kind;

  DistributedLock(ThreadOwners owners) {
    this(owners, HoldKind.EXCLUSIVE);
  }

  DistributedLock(ThreadOwners owners, HoldKind kind) {
    this.client = owners.client;
    this.name = owners.key;
    this.owners = owners;
    this.kind = kind;
  }

  public String getName() {
    return name;
  }

  private static LockOptions watched() {
    return LockOptions.defaults();
  }

  private static LockOptions leased(long lease, TimeUnit unit) {
    if (lease <= 0) {
      // Redisson's convention: no lease given, the watchdog renews.
      return watched();
    }
    return LockOptions.defaults().ttl(unit.toMillis(lease)).watchdog(false);
  }

  /** Takes a hold with {@code opts}, as the calling thread: the general form of every method here. */
  public Hold acquire(LockOptions opts) throws InterruptedException {
    return owners.acquire(kind, opts, true);
  }

  /** Waits without a time limit, ignoring interrupts (the interrupt flag is set again on return). */
  @Override
  public void lock() {
    lockUninterruptibly(watched());
  }

  /** As {@link #lock()}, the hold ending after {@code leaseTime} with no watchdog. */
  public void lock(long leaseTime, TimeUnit unit) {
    lockUninterruptibly(leased(leaseTime, unit));
  }

  private void lockUninterruptibly(LockOptions opts) {
    try {
      owners.acquire(kind, opts.waitForever(), false);
    } catch (InterruptedException e) {
      // Not thrown when not interruptible; keep the flag all the same.
      Thread.currentThread().interrupt();
    }
  }

  @Override
  public void lockInterruptibly() throws InterruptedException {
    owners.acquire(kind, watched().waitForever(), true);
  }

  public void lockInterruptibly(long leaseTime, TimeUnit unit) throws InterruptedException {
    owners.acquire(kind, leased(leaseTime, unit).waitForever(), true);
  }

  /** One attempt: true if the calling thread holds the lock now. */
  @Override
  public boolean tryLock() {
    try {
      owners.acquire(kind, watched(), false);
      return true;
    } catch (WouldBlockException e) {
      return false;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return false;
    }
  }

  @Override
  public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
    return tryWith(watched(), time, unit);
  }

  /** Waits up to {@code waitTime}; the hold ends after {@code leaseTime} (no watchdog; ≤ 0: watchdog). */
  public boolean tryLock(long waitTime, long leaseTime, TimeUnit unit) throws InterruptedException {
    return tryWith(leased(leaseTime, unit), waitTime, unit);
  }

  private boolean tryWith(LockOptions opts, long time, TimeUnit unit) throws InterruptedException {
    long ms = Math.min(unit.toMillis(Math.max(0, time)), LockOptions.MAX_MS);
    try {
      owners.acquire(kind, opts.waitMs(ms), true);
      return true;
    } catch (WouldBlockException | LockTimeoutException e) {
      return false;
    }
  }

  /**
   * Releases one hold of the calling thread. Interrupted while the release
   * is in flight, the hold is given up (retried in the background) and the
   * interrupt flag set again.
   *
   * @throws IllegalMonitorStateException the calling thread does not hold the lock
   * @throws LockLostException the hold was lost before (its lease ended, …)
   */
  @Override
  public void unlock() {
    Hold h = owners.current();
    if (h == null) {
      Hold last = owners.last();
      if (last != null && last.lossReason() != null && last.count() > 0) {
        owners.released();
        throw new LockLostException(last.lossReason());
      }
      throw new IllegalMonitorStateException("the lock " + name + " is not held by the current thread");
    }
    try {
      h.release();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } finally {
      owners.released();
    }
  }

  /** Conditions need a local monitor; a distributed lock has none. */
  @Override
  public Condition newCondition() {
    throw new UnsupportedOperationException("a distributed lock has no Condition");
  }

  /** Whether any thread of this client holds the lock through this name and scope. */
  public boolean isHeldByAnyThread() {
    return owners.anyHeld();
  }

  public boolean isHeldByCurrentThread() {
    return owners.current() != null;
  }

  /** How many times the calling thread holds the lock (0: not at all). */
  public int getHoldCount() {
    Hold h = owners.current();
    return h == null ? 0 : h.count();
  }

  /** The calling thread's hold (its fence, loss signal …); null when it holds none. */
  public Hold getHold() {
    return owners.current();
  }

  /** The fence of the calling thread's hold. */
  public long getFence() {
    Hold h = owners.current();
    if (h == null) {
      throw new IllegalMonitorStateException("the lock " + name + " is not held by the current thread");
    }
    return h.fence();
  }

  /** Whether anyone holds the lock now (the key exists). */
  public boolean isLocked() {
    return remainTimeToLive() != -2;
  }

  /** ms left on the lock's lease on the server ({@code PTTL}); -2 when nobody holds it. */
  public long remainTimeToLive() {
    try {
      Long pttl = Transport.await(client.t.shared.pttl(name).toCompletableFuture(),
          client.t.replyTimeoutNanos, false);
      return pttl == null ? -2 : pttl;
    } catch (ExecutionException e) {
      throw Protocol.map(e);
    } catch (TimeoutException | InterruptedException e) {
      throw new TransportException("no reply to PTTL in time", e);
    }
  }

  @Override
  public String toString() {
    return "DistributedLock[" + name + "]";
  }
}
