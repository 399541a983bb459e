package io.redislock;

/**
 * The client refuses the call before sending anything: options out of range
 * or a combination it cannot keep its promises with.
 */
public class RefusedException extends LockException {
  private static final long serialVersionUID = 1L;

  public RefusedException(String message) {
    super(message);
  }
}
