package io.redislock;

/**
 * The server begins no fresh hold for now: it restarted or was promoted, and
 * waits out its quarantine ({@code lock.max-ttl}). Try again later.
 */
public class QuarantineException extends LockException {
  private static final long serialVersionUID = 1L;

  public QuarantineException() {
    super("the server is in its quarantine after a start or promotion: try again later");
  }
}
