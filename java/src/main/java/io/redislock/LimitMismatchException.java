package io.redislock;

/** A semaphore asked with another limit than the one in force on the lock (or a waiter's). */
public class LimitMismatchException extends LockException {
  private static final long serialVersionUID = 1L;

  public LimitMismatchException(String message) {
    super(message);
  }
}
