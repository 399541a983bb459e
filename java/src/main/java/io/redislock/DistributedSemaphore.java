package io.redislock;

import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;

/**
 * A counting semaphore of leased permits on one key, in the shape of
 * Redisson's {@code RPermitExpirableSemaphore}: each permit is a hold of its
 * own (its own owner token, which is its id, its own lease and its own
 * fence), released by itself or ended by its lease. Permits are not tied to
 * threads. Waiters are served first come, first served.
 */
public final class DistributedSemaphore {
  private final LockClient client;
  private final String name;
  private final HoldKind kind;
  private final ConcurrentHashMap<String, Hold> permits = new ConcurrentHashMap<>();

  DistributedSemaphore(LockClient client, String name, HoldKind kind) {
    this.client = client;
    this.name = name;
    this.kind = kind;
  }

  public String getName() {
    return name;
  }

  /** The semaphore's number of permits. */
  public int limit() {
    return kind.limit();
  }

  /** Takes a permit with {@code opts} (lease, wait, watchdog, ephemeral). */
  public Hold acquire(LockOptions opts) throws InterruptedException {
    Hold h = client.acquire(name, client.newOwner(), kind, opts, true);
    permits.put(h.owner(), h);
    return h;
  }

  /**
   * Takes {@code permits} of the semaphore's permits (1 to its limit) as one
   * hold: one fence, one lease, one release. First come first served: a
   * request for more permits than are free waits at the head of the queue,
   * and smaller requests behind it wait behind it.
   */
  public Hold acquire(int permits, LockOptions opts) throws InterruptedException {
    Hold h = client.acquire(name, client.newOwner(), HoldKind.permits(kind.limit(), permits), opts, true);
    this.permits.put(h.owner(), h);
    return h;
  }

  /** One attempt at {@code permits} permits as one hold; null when too few are free or others wait ahead. */
  public Hold tryAcquire(int permits) {
    try {
      return acquire(permits, LockOptions.defaults());
    } catch (WouldBlockException e) {
      return null;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return null;
    }
  }

  /** Waits for a permit without a time limit; its 30 s lease is renewed by a watchdog until released. */
  public Hold acquire() throws InterruptedException {
    return acquire(LockOptions.defaults().waitForever());
  }

  /** Waits for a permit that ends after {@code leaseTime} unless released before. */
  public Hold acquire(long leaseTime, TimeUnit unit) throws InterruptedException {
    return acquire(LockOptions.defaults().ttl(unit.toMillis(leaseTime)).watchdog(false).waitForever());
  }

  /** One attempt; null when no permit is free. */
  public Hold tryAcquire() {
    try {
      return acquire(LockOptions.defaults());
    } catch (WouldBlockException e) {
      return null;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return null;
    }
  }

  /** Waits up to {@code waitTime}; the permit ends after {@code leaseTime}. Null when none came. */
  public Hold tryAcquire(long waitTime, long leaseTime, TimeUnit unit) throws InterruptedException {
    LockOptions opts = LockOptions.defaults().ttl(unit.toMillis(leaseTime)).watchdog(false)
        .waitMs(Math.min(unit.toMillis(Math.max(0, waitTime)), LockOptions.MAX_MS));
    try {
      return acquire(opts);
    } catch (WouldBlockException | LockTimeoutException e) {
      return null;
    }
  }

  /** Releases the permit whose id ({@link Hold#owner()}) is {@code permitId}. */
  public void release(String permitId) throws InterruptedException {
    Hold h = permits.remove(permitId);
    if (h == null) {
      throw new IllegalArgumentException("no permit " + permitId + " taken through this semaphore");
    }
    h.releaseAll();
  }

  public void release(Hold permit) throws InterruptedException {
    release(permit.owner());
  }
}
