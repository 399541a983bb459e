package io.redislock.spring;

import io.redislock.LockClient;
import io.redislock.LockLostException;
import java.time.Duration;
import java.util.ConcurrentModificationException;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import org.springframework.integration.support.locks.DistributedLock;
import org.springframework.integration.support.locks.ExpirableLockRegistry;
import org.springframework.integration.support.locks.RenewableLockRegistry;
import org.springframework.scheduling.TaskScheduler;

/**
 * Spring Integration's lock registry on the lock module, in the shape of
 * {@code RedisLockRegistry} (spring-integration-redis 7): {@code obtain(key)}
 * gives a {@link DistributedLock} on {@code <registryKey>:<key>},
 * {@code lock(Duration)} and {@code tryLock(Duration, Duration)} take a lease,
 * {@link #renewLock} renews the calling thread's hold, and
 * {@link #expireUnusedOlderThan} forgets idle lock objects. A Spring Boot
 * application swaps its {@code RedisLockRegistry} bean for this one.
 *
 * <p>What changes underneath: waits are parked in the server, first come
 * first served (no polling, no pub/sub that hangs on master/replica setups),
 * a hold carries a fence ({@link #fenceOf}), and a hold lost to its lease is
 * known locally at once. The default lease is 60 s, as {@code RedisLockRegistry}'s;
 * {@link #setRenewalTaskScheduler} turns on renewal every third of it (done
 * by the client's own timer, the scheduler given is not used).
 */
public class ModuleLockRegistry implements ExpirableLockRegistry<DistributedLock>,
    RenewableLockRegistry<DistributedLock> {
  /** RedisLockRegistry's default lease. */
  public static final long DEFAULT_EXPIRE_AFTER = 60_000;

  private final LockClient client;
  private final String registryKey;
  private final long expireAfter;
  private volatile boolean renewing;
  private final Map<String, ModuleLock> locks = new ConcurrentHashMap<>();

  public ModuleLockRegistry(LockClient client, String registryKey) {
    this(client, registryKey, DEFAULT_EXPIRE_AFTER);
  }

  public ModuleLockRegistry(LockClient client, String registryKey, long expireAfter) {
    if (expireAfter < 1) {
      throw new IllegalArgumentException("expireAfter must be at least 1 ms");
    }
    this.client = client;
    this.registryKey = registryKey;
    this.expireAfter = expireAfter;
  }

  @Override
  public DistributedLock obtain(Object lockKey) {
    if (!(lockKey instanceof String)) {
      throw new IllegalArgumentException("the lock key must be a String");
    }
    String key = (String) lockKey;
    ModuleLock lock = locks.computeIfAbsent(key, k -> new ModuleLock(client.getLock(registryKey + ":" + k)));
    lock.touch();
    return lock;
  }

  /** Forgets lock objects that nobody here holds and that were last used before {@code age} ms ago. */
  @Override
  public void expireUnusedOlderThan(long age) {
    long now = System.currentTimeMillis();
    locks.entrySet().removeIf(e -> !e.getValue().isHeldHere() && now - e.getValue().lastUsed > age);
  }

  @Override
  public void renewLock(Object lockKey) {
    renewLock(lockKey, Duration.ofMillis(expireAfter));
  }

  /**
   * Renews the calling thread's hold on {@code lockKey} to {@code ttl} from now.
   *
   * @throws IllegalStateException the calling thread does not hold it
   */
  @Override
  public void renewLock(Object lockKey, Duration ttl) {
    ModuleLock lock = locks.get(String.valueOf(lockKey));
    io.redislock.Hold h = lock == null ? null : lock.inner.getHold();
    if (h == null) {
      throw new IllegalStateException("the lock " + registryKey + ":" + lockKey
          + " is not held by the current thread");
    }
    try {
      h.renew(ttl.toMillis());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted while renewing", e);
    } catch (LockLostException e) {
      throw new ConcurrentModificationException("the lock " + registryKey + ":" + lockKey
          + " was lost (" + e.reason().wireName() + ") before its renewal", e);
    }
  }

  /** Renewal every third of the lease from now on (by the client's timer; {@code scheduler} is not used). */
  @Override
  public void setRenewalTaskScheduler(TaskScheduler scheduler) {
    this.renewing = true;
  }

  /** The fence of the calling thread's hold on {@code lockKey}. */
  public long fenceOf(Object lockKey) {
    ModuleLock lock = locks.get(String.valueOf(lockKey));
    if (lock == null || !lock.inner.isHeldByCurrentThread()) {
      throw new IllegalStateException("the lock " + lockKey + " is not held by the current thread");
    }
    return lock.inner.getFence();
  }

  /** One key's lock: the client's per-thread reentrant lock with Spring's lease methods and exceptions. */
  private final class ModuleLock implements DistributedLock {
    final io.redislock.DistributedLock inner;
    volatile long lastUsed;

    ModuleLock(io.redislock.DistributedLock inner) {
      this.inner = inner;
    }

    void touch() {
      lastUsed = System.currentTimeMillis();
    }

    boolean isHeldHere() {
      return inner.isHeldByAnyThread();
    }

    /** The lease of lock() and friends: the registry's, renewed or not as the registry says. */
    private long lease() {
      // A lease of 0 asks the client for its watchdog.
      return renewing ? 0 : expireAfter;
    }

    @Override
    public void lock() {
      touch();
      inner.lock(lease(), TimeUnit.MILLISECONDS);
    }

    @Override
    public void lock(Duration ttl) {
      touch();
      inner.lock(ttl.toMillis(), TimeUnit.MILLISECONDS);
    }

    @Override
    public void lockInterruptibly() throws InterruptedException {
      touch();
      inner.lockInterruptibly(lease(), TimeUnit.MILLISECONDS);
    }

    @Override
    public boolean tryLock() {
      try {
        return tryLock(0, TimeUnit.MILLISECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return false;
      }
    }

    @Override
    public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
      touch();
      return inner.tryLock(time, lease(), unit == null ? TimeUnit.MILLISECONDS : unit);
    }

    @Override
    public boolean tryLock(Duration waitTime, Duration ttl) throws InterruptedException {
      touch();
      return inner.tryLock(waitTime.toMillis(), ttl.toMillis(), TimeUnit.MILLISECONDS);
    }

    /**
     * As RedisLockRegistry's: {@link IllegalStateException} when the calling
     * thread does not hold it, {@link ConcurrentModificationException} when
     * the hold had been lost (its lease ended) before the unlock.
     */
    @Override
    public void unlock() {
      touch();
      try {
        inner.unlock();
      } catch (IllegalMonitorStateException e) {
        throw new IllegalStateException("You do not own lock at " + inner.getName(), e);
      } catch (LockLostException e) {
        throw new ConcurrentModificationException("Lock was released in the store due to expiration. "
            + "The integrity of data protected by this lock may have been compromised.", e);
      }
    }

    @Override
    public Condition newCondition() {
      throw new UnsupportedOperationException("Conditions are not supported");
    }

    @Override
    public String toString() {
      return "ModuleLock [lockKey=" + inner.getName() + "]";
    }
  }
}
