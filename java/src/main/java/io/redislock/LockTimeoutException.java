package io.redislock;

/** A wait ended before the lock was granted; nothing is held. */
public class LockTimeoutException extends LockException {
  private static final long serialVersionUID = 1L;

  public LockTimeoutException() {
    super("timed out waiting for the lock");
  }
}
