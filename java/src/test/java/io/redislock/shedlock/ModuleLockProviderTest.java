package io.redislock.shedlock;

import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.api.sync.RedisCommands;
import io.redislock.LockClient;
import io.redislock.TestServer;
import java.time.Duration;
import java.util.Optional;
import net.javacrumbs.shedlock.core.ClockProvider;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.SimpleLock;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * What the provider adds to ShedLock's contract (which
 * {@link ModuleLockProviderContractTest} runs): the lease shortened at unlock
 * to what is left of lockAtLeastFor, and a fence per run.
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

  @Test
  void lock_at_least_for_keeps_it_after_unlock_for_what_is_left_of_it() {
    Optional<SimpleLock> lock = provider.lock(config(NAME, Duration.ofSeconds(4), Duration.ofSeconds(2)));
    assertTrue(lock.isPresent());
    lock.get().unlock();
    assertTrue(provider.lock(config(NAME)).isEmpty(), "held for lockAtLeastFor");
    long pttl = redis.pttl("shedlock:" + NAME);
    assertTrue(pttl > 0 && pttl <= 2000, "the lease is what is left of lockAtLeastFor: " + pttl);
  }

  @Test
  void each_run_has_a_higher_fence_than_the_last() {
    long last = 0;
    for (int i = 0; i < 3; i++) {
      SimpleLock lock = provider.lock(config(NAME)).orElseThrow();
      long fence = ((ModuleLockProvider.ModuleLock) lock).fence();
      assertTrue(fence > last, "fence " + fence + " after " + last);
      last = fence;
      lock.unlock();
    }
  }
}
