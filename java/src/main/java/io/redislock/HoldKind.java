package io.redislock;

import java.util.HashSet;
import java.util.List;

/**
 * What an acquire asks the server for: the lock alone (a mutex, or a
 * read-write lock's write side), a shared hold (the read side), some of
 * {@code limit} permits of a semaphore, or several keys at once (exclusive,
 * all or none: {@code LOCK.MACQUIRE}). Each kind adds its words to
 * {@code LOCK.ACQUIRE}.
 */
public final class HoldKind {
  /** The most permits a semaphore may have (the server's bound). */
  public static final int MAX_PERMITS = 1_000_000;

  /** The most keys one hold on several keys may name (the server's bound). */
  public static final int MAX_KEYS = 64;

  public static final HoldKind EXCLUSIVE = new HoldKind(false, 0, 1, null);
  public static final HoldKind SHARED = new HoldKind(true, 0, 1, null);

  private final boolean shared;
  private final int limit;
  private final int permits;
  private final List<String> keys;

  private HoldKind(boolean shared, int limit, int permits, List<String> keys) {
    this.shared = shared;
    this.limit = limit;
    this.permits = permits;
    this.keys = keys;
  }

  /** One of {@code limit} permits of a semaphore. */
  public static HoldKind permit(int limit) {
    return permits(limit, 1);
  }

  /**
   * {@code permits} of {@code limit} permits of a semaphore, as one hold:
   * admitted while the permits held stay within the limit, first come first
   * served (a request for more than are free waits at the head of the queue).
   */
  public static HoldKind permits(int limit, int permits) {
    if (limit < 1 || limit > MAX_PERMITS) {
      throw new RefusedException("a semaphore's limit must be from 1 to " + MAX_PERMITS + ", not " + limit);
    }
    if (permits < 1 || permits > limit) {
      throw new RefusedException("a semaphore's request takes 1 to its limit (" + limit + ") of permits, not "
          + permits);
    }
    return new HoldKind(true, limit, permits, null);
  }

  /** An exclusive hold on every one of {@code keys} at once (1 to 64 distinct keys). */
  public static HoldKind keys(List<String> keys) {
    if (keys == null || keys.isEmpty() || keys.size() > MAX_KEYS) {
      throw new RefusedException("a hold on several keys takes 1 to " + MAX_KEYS + " keys");
    }
    if (new HashSet<>(keys).size() != keys.size()) {
      throw new RefusedException("a hold on several keys names each key once: " + keys);
    }
    for (String k : keys) {
      LockClient.checkName(k, "key");
    }
    return new HoldKind(false, 0, 1, List.copyOf(keys));
  }

  public boolean isShared() {
    return shared;
  }

  /** The semaphore's limit; 0 for an exclusive or read hold. */
  public int limit() {
    return limit;
  }

  /** The semaphore permits one hold takes (1 unless asked for more). */
  public int permits() {
    return permits;
  }

  /** The keys of a hold on several keys at once; null for a hold on one key. */
  public List<String> keys() {
    return keys;
  }

  @Override
  public String toString() {
    return keys != null ? "exclusive on " + keys
        : !shared ? "exclusive" : limit == 0 ? "shared" : permits + " permit(s) of " + limit;
  }
}
