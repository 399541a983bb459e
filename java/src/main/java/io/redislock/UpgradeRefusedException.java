package io.redislock;

/**
 * A reader asked for the write side of a read-write lock it holds for
 * reading. Refused at once: two readers upgrading would wait on each other
 * for ever. Release the read hold first.
 */
public class UpgradeRefusedException extends LockException {
  private static final long serialVersionUID = 1L;

  public UpgradeRefusedException() {
    super("the owner holds the lock shared: release it before asking for it exclusively");
  }
}
