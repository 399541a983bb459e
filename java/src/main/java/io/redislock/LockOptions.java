package io.redislock;

import java.time.Duration;

/**
 * The options of one acquire, checked before anything is sent. Immutable:
 * each {@code with…} method returns a copy.
 *
 * <pre>{@code
 * LockOptions.defaults().ttl(Duration.ofSeconds(10)).waitFor(Duration.ofSeconds(5))
 * }</pre>
 */
public final class LockOptions {
  /** The server's bound on a lease and a wait: 2^40 ms (about 34.8 years). */
  public static final long MAX_MS = 1L << 40;
  /** The lease when none is given; the watchdog renews it, as Redisson's 30 s watchdog lease. */
  public static final long DEFAULT_TTL_MS = 30_000;
  /** {@link #waitMs()} of a try: one attempt, no wait. */
  public static final long NO_WAIT = -1;
  /** {@link #waitMs()} of a wait without a time limit. */
  public static final long FOREVER = Long.MAX_VALUE;

  private static final LockOptions DEFAULTS = new LockOptions(DEFAULT_TTL_MS, true, NO_WAIT, false);

  private final long ttlMs;
  private final boolean watchdog;
  private final long waitMs;
  private final boolean ephemeral;

  private LockOptions(long ttlMs, boolean watchdog, long waitMs, boolean ephemeral) {
    this.ttlMs = ttlMs;
    this.watchdog = watchdog;
    this.waitMs = waitMs;
    this.ephemeral = ephemeral;
  }

  /** A 30 s lease renewed by the watchdog, no wait, not ephemeral. */
  public static LockOptions defaults() {
    return DEFAULTS;
  }

  /** The lease in ms, 1 to 2^40. */
  public LockOptions ttl(long ms) {
    if (ms < 1 || ms > MAX_MS) {
      throw new RefusedException("ttl must be from 1 to 2^40 ms, not " + ms);
    }
    return new LockOptions(ms, watchdog, waitMs, ephemeral);
  }

  public LockOptions ttl(Duration lease) {
    return ttl(toMillis(lease, "ttl"));
  }

  /**
   * Renew the lease every third of the ttl while held (default on). Off, the
   * lease is renewed only by {@link Hold#renew()}, and the loss signal fires at
   * the local deadline.
   */
  public LockOptions watchdog(boolean on) {
    return new LockOptions(ttlMs, on, waitMs, ephemeral);
  }

  /**
   * Wait up to {@code ms} for the lock (the server's {@code WAIT}, first come
   * first served). 0 is a try; {@link #FOREVER} waits without a limit.
   */
  public LockOptions waitMs(long ms) {
    if (ms == FOREVER || ms == NO_WAIT) {
      return new LockOptions(ttlMs, watchdog, ms, ephemeral);
    }
    if (ms < 0 || ms > MAX_MS) {
      throw new RefusedException("wait must be from 0 to 2^40 ms, not " + ms);
    }
    return new LockOptions(ttlMs, watchdog, ms == 0 ? NO_WAIT : ms, ephemeral);
  }

  public LockOptions waitFor(Duration wait) {
    return waitMs(toMillis(wait, "wait"));
  }

  public LockOptions waitForever() {
    return waitMs(FOREVER);
  }

  /**
   * An ephemeral hold: taken on a connection of its own kept for the hold's
   * life; the server ends the hold the moment that connection closes, and the
   * loss signal fires with {@link LossReason#DISCONNECTED}.
   */
  public LockOptions ephemeral(boolean on) {
    return new LockOptions(ttlMs, watchdog, waitMs, on);
  }

  public long ttlMs() {
    return ttlMs;
  }

  public boolean watchdog() {
    return watchdog;
  }

  public long waitMs() {
    return waitMs;
  }

  public boolean isEphemeral() {
    return ephemeral;
  }

  boolean waits() {
    return waitMs != NO_WAIT;
  }

  static long toMillis(Duration d, String what) {
    if (d.isNegative()) {
      throw new RefusedException(what + " must not be negative, not " + d);
    }
    if (d.compareTo(Duration.ofMillis(MAX_MS)) > 0) {
      throw new RefusedException(what + " must be at most 2^40 ms, not " + d);
    }
    return d.toMillis();
  }
}
