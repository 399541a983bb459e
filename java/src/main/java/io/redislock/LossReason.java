package io.redislock;

/** How a held lock was lost. */
public enum LossReason {
  /** The local deadline passed without a renew confirming the lease. */
  EXPIRED("expired"),
  /** The server answered {@code -NOTOWNER} (or the key now holds another type). */
  NOT_OWNER("not-owner"),
  /** An ephemeral hold's own connection closed: the server ended the hold. */
  DISCONNECTED("disconnected"),
  /**
   * A release did not complete (interrupted, timed out, transport error): the
   * handle gives the lock up and the release is retried in the background.
   */
  RELEASE_UNCONFIRMED("release-unconfirmed");

  private final String wireName;

  LossReason(String wireName) {
    this.wireName = wireName;
  }

  /** The name every client of the project uses for this reason. */
  public String wireName() {
    return wireName;
  }
}
