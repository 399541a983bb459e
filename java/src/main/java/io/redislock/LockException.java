package io.redislock;

/**
 * The base of every error a lock call throws. Each failure is its own
 * subclass, named as in the project's other clients, so callers tell "lost
 * the lock" from "someone else has it" from a bug in the call with a
 * {@code catch} clause.
 */
public class LockException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public LockException(String message) {
    super(message);
  }

  public LockException(String message, Throwable cause) {
    super(message, cause);
  }
}
