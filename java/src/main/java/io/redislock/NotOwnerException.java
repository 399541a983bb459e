package io.redislock;

/**
 * The server says this owner does not hold the lock ({@code -NOTOWNER}): it
 * was released, or its lease ended, or (resuming by token) it never was.
 */
public class NotOwnerException extends LockException {
  private static final long serialVersionUID = 1L;

  public NotOwnerException() {
    super("the lock is not held by this owner");
  }
}
