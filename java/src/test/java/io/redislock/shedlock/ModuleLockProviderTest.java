package io.redislock.shedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.api.sync.RedisCommands;
import io.redislock.LockClient;
import io.redislock.TestServer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import net.javacrumbs.shedlock.core.ClockProvider;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.SimpleLock;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The scenarios of ShedLock's provider contract (its
 * {@code AbstractExtensibleLockProviderIntegrationTest}, which ShedLock does
 * not publish to Maven Central), written against the provider on a real
 * server: lock, no second lock, lockAtMostFor, lockAtLeastFor, extend, and a
 * run that may not unlock or extend twice.
 */
class ModuleLockProviderTest {
  static final String NAME = "name";
  static TestServer server;
  static LockClient client;
  static RedisCommands<String, String> redis;
  static ModuleLockProvider provider;

  @BeforeAll
  static void start() throws Exception {
    server = TestServer.start();
    client = LockClient.create(server.url());
    redis = server.cmd();
    provider = new ModuleLockProvider(client);
  }

  @AfterAll
  static void stop() throws Exception {
    client.close();
    server.close();
  }

  @AfterEach
  void clean() {
    redis.flushall();
  }

  static LockConfiguration config(String name, Duration atMost, Duration atLeast) {
    return new LockConfiguration(ClockProvider.now(), name, atMost, atLeast);
  }

  static LockConfiguration config(String name) {
    return config(name, Duration.ofMinutes(5), Duration.ZERO);
  }

  static boolean locked(String name) {
    return redis.exists("shedlock:" + name) == 1;
  }

  @Test
  void creates_a_lock_and_unlock_frees_it() {
    Optional<SimpleLock> lock = provider.lock(config(NAME));
    assertTrue(lock.isPresent());
    assertTrue(locked(NAME));
    lock.get().unlock();
    assertFalse(locked(NAME));
  }

  @Test
  void a_second_lock_is_refused_and_two_names_are_independent() {
    Optional<SimpleLock> lock = provider.lock(config(NAME));
    assertTrue(lock.isPresent());
    assertTrue(provider.lock(config(NAME)).isEmpty());
    Optional<SimpleLock> other = provider.lock(config("name2"));
    assertTrue(other.isPresent());
    lock.get().unlock();
    other.get().unlock();
  }

  @Test
  void locks_right_after_unlock_ten_times() {
    for (int i = 0; i < 10; i++) {
      Optional<SimpleLock> lock = provider.lock(config(NAME));
      assertTrue(lock.isPresent());
      assertTrue(provider.lock(config(NAME)).isEmpty());
      lock.get().unlock();
    }
  }

  @Test
  void lock_at_most_for_ends_the_lock() throws Exception {
    Optional<SimpleLock> lock = provider.lock(config(NAME, Duration.ofMillis(50), Duration.ZERO));
    assertTrue(lock.isPresent());
    Thread.sleep(60);
    assertFalse(locked(NAME));
    Optional<SimpleLock> again = provider.lock(config(NAME, Duration.ofMillis(50), Duration.ZERO));
    assertTrue(again.isPresent());
    again.get().unlock();
  }

  @Test
  void lock_at_least_for_keeps_it_after_unlock() throws Exception {
    Optional<SimpleLock> lock = provider.lock(config(NAME, Duration.ofSeconds(4), Duration.ofSeconds(2)));
    assertTrue(lock.isPresent());
    lock.get().unlock();
    assertTrue(provider.lock(config(NAME)).isEmpty(), "held for lockAtLeastFor");
    long pttl = redis.pttl("shedlock:" + NAME);
    assertTrue(pttl > 0 && pttl <= 2000, "the lease is what is left of lockAtLeastFor: " + pttl);
    Thread.sleep(2000);
    Optional<SimpleLock> after = provider.lock(config(NAME));
    assertTrue(after.isPresent(), "free after lockAtLeastFor");
    after.get().unlock();
  }

  @Test
  void extend_keeps_it_past_the_first_lease() throws Exception {
    Optional<SimpleLock> lock = provider.lock(config(NAME, Duration.ofMillis(1000), Duration.ZERO));
    assertTrue(lock.isPresent());
    Optional<SimpleLock> extended = lock.get().extend(Duration.ofSeconds(10), Duration.ZERO);
    assertTrue(extended.isPresent());
    Thread.sleep(1000);
    assertTrue(locked(NAME));
    extended.get().unlock();
    assertFalse(locked(NAME));
  }

  @Test
  void an_unlocked_or_extended_lock_cannot_be_used_again() {
    Optional<SimpleLock> lock = provider.lock(config(NAME, Duration.ofSeconds(1), Duration.ZERO));
    lock.get().unlock();
    assertThrows(IllegalStateException.class, () -> lock.get().extend(Duration.ofSeconds(10), Duration.ZERO));
    Optional<SimpleLock> second = provider.lock(config(NAME, Duration.ofSeconds(10), Duration.ZERO));
    Optional<SimpleLock> extended = second.get().extend(Duration.ofSeconds(10), Duration.ofSeconds(9));
    assertTrue(extended.isPresent());
    assertThrows(IllegalStateException.class, () -> second.get().extend(Duration.ofSeconds(10), Duration.ZERO));
    assertThrows(IllegalStateException.class, () -> second.get().unlock());
    extended.get().unlock();
    assertTrue(locked(NAME), "extend's lockAtLeastFor keeps it");
  }

  @Test
  void an_expired_lock_cannot_be_extended() throws Exception {
    Optional<SimpleLock> lock = provider.lock(config(NAME, Duration.ofMillis(20), Duration.ZERO));
    assertTrue(lock.isPresent());
    Thread.sleep(40);
    assertTrue(lock.get().extend(Duration.ofSeconds(10), Duration.ZERO).isEmpty());
    assertFalse(locked(NAME));
  }

  @Test
  void threads_racing_for_one_job_never_run_it_twice_at_once() throws Exception {
    AtomicInteger running = new AtomicInteger();
    AtomicInteger runs = new AtomicInteger();
    ExecutorService pool = Executors.newFixedThreadPool(4);
    List<Future<?>> all = new ArrayList<>();
    for (int t = 0; t < 4; t++) {
      all.add(pool.submit(() -> {
        for (int i = 0; i < 40; i++) {
          Optional<SimpleLock> lock = provider.lock(config("fuzz", Duration.ofSeconds(10), Duration.ZERO));
          if (lock.isPresent()) {
            assertEquals(1, running.incrementAndGet(), "two runs at once");
            runs.incrementAndGet();
            running.decrementAndGet();
            lock.get().unlock();
          }
        }
        return null;
      }));
    }
    for (Future<?> f : all) {
      f.get(60, TimeUnit.SECONDS);
    }
    pool.shutdown();
    assertTrue(runs.get() > 0);
  }
}
