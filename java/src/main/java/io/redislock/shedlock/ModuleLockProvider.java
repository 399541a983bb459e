package io.redislock.shedlock;

import io.redislock.Hold;
import io.redislock.HoldKind;
import io.redislock.LockClient;
import io.redislock.LockException;
import io.redislock.LockLostException;
import io.redislock.LockOptions;
import io.redislock.NotOwnerException;
import io.redislock.QuarantineException;
import io.redislock.WouldBlockException;
import java.time.Duration;
import java.time.Instant;
import java.util.Optional;
import java.util.concurrent.atomic.AtomicBoolean;
import net.javacrumbs.shedlock.core.ClockProvider;
import net.javacrumbs.shedlock.core.ExtensibleLockProvider;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.SimpleLock;

/**
 * ShedLock's lock provider on the lock module: {@code lockAtMostFor} is the
 * hold's lease (the server ends it then, even if this process hangs),
 * {@code lockAtLeastFor} is kept at unlock by shortening the lease to what is
 * left of it instead of releasing, and {@code extend} renews the lease (the
 * provider is an {@link ExtensibleLockProvider}, so ShedLock's
 * {@code KeepAliveLockProvider} works on it). Each lock is held under a new
 * owner token, so a job's lock can only be released or extended by the run
 * that took it, and carries a fence ({@link ModuleLock#fence()}).
 */
public class ModuleLockProvider implements ExtensibleLockProvider {
  private final LockClient client;
  private final String prefix;

  /** Keys are {@code shedlock:<name>}. */
  public ModuleLockProvider(LockClient client) {
    this(client, "shedlock:");
  }

  public ModuleLockProvider(LockClient client, String keyPrefix) {
    this.client = client;
    this.prefix = keyPrefix;
  }

  @Override
  public Optional<SimpleLock> lock(LockConfiguration cfg) {
    long ttl = millisUntil(cfg.getLockAtMostUntil());
    if (ttl < 1) {
      return Optional.empty();
    }
    try {
      Hold h = client.acquire(prefix + cfg.getName(), client.newOwner(), HoldKind.EXCLUSIVE,
          LockOptions.defaults().ttl(Math.min(ttl, LockOptions.MAX_MS)).watchdog(false));
      return Optional.of(new ModuleLock(h, cfg.getLockAtLeastUntil()));
    } catch (WouldBlockException | QuarantineException e) {
      return Optional.empty();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return Optional.empty();
    }
  }

  static long millisUntil(Instant t) {
    return Duration.between(ClockProvider.now(), t).toMillis();
  }

  /** One run's lock. Valid until unlocked or extended (extend returns the lock to use next). */
  public static final class ModuleLock implements SimpleLock {
    private final Hold hold;
    private final Instant lockAtLeastUntil;
    private final AtomicBoolean valid = new AtomicBoolean(true);

    ModuleLock(Hold hold, Instant lockAtLeastUntil) {
      this.hold = hold;
      this.lockAtLeastUntil = lockAtLeastUntil;
    }

    /** The hold's fencing token: send it with the job's writes. */
    public long fence() {
      return hold.fence();
    }

    private void invalidate(String what) {
      if (!valid.compareAndSet(true, false)) {
        throw new IllegalStateException("cannot " + what + ": the lock was already unlocked or extended");
      }
    }

    /** Releases the lock, or, while {@code lockAtLeastFor} runs, leaves it held until then. */
    @Override
    public void unlock() {
      invalidate("unlock");
      long keep = millisUntil(lockAtLeastUntil);
      try {
        if (keep > 0) {
          hold.renew(keep);
          hold.stopWatchdog();
        } else {
          hold.releaseAll();
        }
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      } catch (LockLostException | NotOwnerException e) {
        // Its lease ended already: nothing to release.
      } catch (LockException e) {
        // The lease ends it at lockAtMostFor whatever happens here.
      }
    }

    /** Renews the lease to {@code lockAtMostFor} from now; empty when the lock was lost meanwhile. */
    @Override
    public Optional<SimpleLock> extend(Duration lockAtMostFor, Duration lockAtLeastFor) {
      invalidate("extend");
      try {
        hold.renew(Math.max(1, Math.min(lockAtMostFor.toMillis(), LockOptions.MAX_MS)));
        return Optional.of(new ModuleLock(hold, ClockProvider.now().plus(lockAtLeastFor)));
      } catch (LockLostException | NotOwnerException e) {
        return Optional.empty();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return Optional.empty();
      }
    }
  }
}
