package io.redislock;

/** The key holds a value of another type ({@code -WRONGTYPE}): a hold on it is lost. */
public class WrongTypeException extends LockException {
  private static final long serialVersionUID = 1L;

  public WrongTypeException(String message) {
    super(message);
  }
}
