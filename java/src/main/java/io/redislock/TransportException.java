package io.redislock;

/** A connection or I/O failure, a reply that did not come in time, or an unexpected server error. */
public class TransportException extends LockException {
  private static final long serialVersionUID = 1L;

  public TransportException(String message, Throwable cause) {
    super(message, cause);
  }
}
