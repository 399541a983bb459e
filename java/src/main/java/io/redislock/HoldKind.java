package io.redislock;

/**
 * What an acquire asks the server for: the lock alone (a mutex, or a
 * read-write lock's write side), a shared hold (the read side), or one of
 * {@code limit} permits of a semaphore. Each kind adds its words to
 * {@code LOCK.ACQUIRE}.
 */
public final class HoldKind {
  /** The most permits a semaphore may have (the server's bound). */
  public static final int MAX_PERMITS = 1_000_000;

  public static final HoldKind EXCLUSIVE = new HoldKind(false, 0);
  public static final HoldKind SHARED = new HoldKind(true, 0);

  private final boolean shared;
  private final int limit;

  private HoldKind(boolean shared, int limit) {
    this.shared = shared;
    this.limit = limit;
  }

  /** One of {@code limit} permits of a semaphore. */
  public static HoldKind permit(int limit) {
    if (limit < 1 || limit > MAX_PERMITS) {
      throw new RefusedException("a semaphore's limit must be from 1 to " + MAX_PERMITS + ", not " + limit);
    }
    return new HoldKind(true, limit);
  }

  public boolean isShared() {
    return shared;
  }

  /** The semaphore's limit; 0 for an exclusive or read hold. */
  public int limit() {
    return limit;
  }

  @Override
  public String toString() {
    return !shared ? "exclusive" : limit == 0 ? "shared" : "permit of " + limit;
  }
}
