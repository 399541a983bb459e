package io.redislock;

/** A try (no wait) found the lock held by another owner, or others waiting ahead. */
public class WouldBlockException extends LockException {
  private static final long serialVersionUID = 1L;

  public WouldBlockException() {
    super("the lock is held by another owner");
  }
}
