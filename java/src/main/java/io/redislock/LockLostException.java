package io.redislock;

/** The hold was lost; {@link #reason()} says how. Thrown by renew and release after the loss. */
public class LockLostException extends LockException {
  private static final long serialVersionUID = 1L;
  private final LossReason reason;

  public LockLostException(LossReason reason) {
    super("the lock was lost: " + describe(reason));
    this.reason = reason;
  }

  public LossReason reason() {
    return reason;
  }

  private static String describe(LossReason reason) {
    switch (reason) {
      case EXPIRED:
        return "its lease ran out before a renew confirmed it";
      case NOT_OWNER:
        return "the server no longer lists this owner";
      case DISCONNECTED:
        return "its ephemeral hold's connection closed";
      default:
        return "its release was not confirmed (retried in the background)";
    }
  }
}
