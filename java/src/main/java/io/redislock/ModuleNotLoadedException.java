package io.redislock;

/** The server does not know the {@code LOCK.*} commands: load the module. */
public class ModuleNotLoadedException extends LockException {
  private static final long serialVersionUID = 1L;

  public ModuleNotLoadedException(Throwable cause) {
    super("the server does not know LOCK.* commands: load the redislock module "
        + "(loadmodule /path/to/libredislock.so)", cause);
  }
}
