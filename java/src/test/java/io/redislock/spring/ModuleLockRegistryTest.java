package io.redislock.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.api.sync.RedisCommands;
import io.redislock.LockClient;
import io.redislock.TestServer;
import java.time.Duration;
import java.util.ConcurrentModificationException;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Lock;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.springframework.integration.leader.Context;
import org.springframework.integration.leader.DefaultCandidate;
import org.springframework.integration.support.leader.LockRegistryLeaderInitiator;
import org.springframework.integration.support.locks.DistributedLock;

/**
 * The scenarios of Spring Integration's own {@code RedisLockRegistry} tests
 * that apply, on a real server, and Spring's {@code LockRegistryLeaderInitiator}
 * electing a leader over the registry.
 */
class ModuleLockRegistryTest {
  static TestServer server;
  static LockClient client;
  static LockClient otherClient;
  static RedisCommands<String, String> redis;

  @BeforeAll
  static void start() throws Exception {
    server = TestServer.start();
    client = LockClient.create(server.url());
    otherClient = LockClient.create(server.url());
    redis = server.cmd();
  }

  @AfterAll
  static void stop() throws Exception {
    client.close();
    otherClient.close();
    server.close();
  }

  @Test
  void lock_then_unlock_frees_the_key() {
    ModuleLockRegistry registry = new ModuleLockRegistry(client, "registry-lock");
    Lock lock = registry.obtain("foo");
    lock.lock();
    assertEquals(1, redis.exists("registry-lock:foo"));
    assertTrue(redis.pttl("registry-lock:foo") > 50_000, "RedisLockRegistry's 60 s lease");
    lock.unlock();
    assertEquals(0, redis.exists("registry-lock:foo"));
  }

  @Test
  void reentrant_lock_counts_per_thread() throws Exception {
    ModuleLockRegistry registry = new ModuleLockRegistry(client, "registry-reentrant");
    Lock lock1 = registry.obtain("foo");
    lock1.lock();
    Lock lock2 = registry.obtain("foo");
    assertSame(lock1, lock2);
    lock2.lockInterruptibly();
    lock2.unlock();
    assertEquals(1, redis.exists("registry-reentrant:foo"));
    lock1.unlock();
    assertEquals(0, redis.exists("registry-reentrant:foo"));
  }

  @Test
  void two_registries_exclude_each_other_and_a_waiter_gets_it_at_the_unlock() throws Exception {
    ModuleLockRegistry registry1 = new ModuleLockRegistry(client, "registry-two");
    ModuleLockRegistry registry2 = new ModuleLockRegistry(otherClient, "registry-two");
    Lock lock1 = registry1.obtain("foo");
    Lock lock2 = registry2.obtain("foo");
    assertNotSame(lock1, lock2);
    lock1.lock();
    CompletableFuture<Boolean> other = CompletableFuture.supplyAsync(() -> {
      try {
        boolean got = lock2.tryLock(10, TimeUnit.SECONDS);
        if (got) {
          lock2.unlock();
        }
        return got;
      } catch (InterruptedException e) {
        return false;
      }
    });
    assertFalse(CompletableFuture.supplyAsync(lock2::tryLock).get(5, TimeUnit.SECONDS));
    Thread.sleep(100);
    lock1.unlock();
    assertTrue(other.get(10, TimeUnit.SECONDS));
  }

  @Test
  void unlock_from_another_thread_is_an_illegal_state() throws Exception {
    ModuleLockRegistry registry = new ModuleLockRegistry(client, "registry-thread");
    Lock lock = registry.obtain("foo");
    lock.lock();
    CompletableFuture<Throwable> other = CompletableFuture.supplyAsync(() -> {
      try {
        lock.unlock();
        return null;
      } catch (Throwable e) {
        return e;
      }
    });
    assertTrue(other.get(5, TimeUnit.SECONDS) instanceof IllegalStateException);
    lock.unlock();
  }

  @Test
  void unlock_after_the_lease_ended_is_a_concurrent_modification() throws Exception {
    ModuleLockRegistry registry = new ModuleLockRegistry(client, "registry-expire", 200);
    Lock lock = registry.obtain("foo");
    lock.lock();
    Thread.sleep(400);
    assertEquals(0, redis.exists("registry-expire:foo"));
    assertThrows(ConcurrentModificationException.class, lock::unlock);
  }

  @Test
  void lock_with_a_ttl_and_renew_lock() throws Exception {
    ModuleLockRegistry registry = new ModuleLockRegistry(client, "registry-renew");
    DistributedLock lock = registry.obtain("foo");
    lock.lock(Duration.ofMillis(1000));
    assertTrue(redis.pttl("registry-renew:foo") <= 1000);
    registry.renewLock("foo", Duration.ofSeconds(20));
    assertTrue(redis.pttl("registry-renew:foo") > 15_000);
    assertTrue(lock.tryLock(Duration.ZERO, Duration.ofSeconds(5)));
    lock.unlock();
    lock.unlock();
    assertThrows(IllegalStateException.class, () -> registry.renewLock("foo"));
    assertThrows(IllegalStateException.class, () -> registry.renewLock("never-obtained"));
  }

  @Test
  void expire_unused_forgets_idle_locks_but_not_held_ones() throws Exception {
    ModuleLockRegistry registry = new ModuleLockRegistry(client, "registry-unused");
    Lock held = registry.obtain("held");
    Lock idle = registry.obtain("idle");
    held.lock();
    Thread.sleep(20);
    registry.expireUnusedOlderThan(0);
    assertSame(held, registry.obtain("held"));
    assertNotSame(idle, registry.obtain("idle"));
    held.unlock();
  }

  @Test
  void the_leader_initiator_elects_one_leader_and_hands_over_when_it_yields() throws Exception {
    ModuleLockRegistry registry1 = new ModuleLockRegistry(client, "registry-leader", 2000);
    ModuleLockRegistry registry2 = new ModuleLockRegistry(otherClient, "registry-leader", 2000);
    List<String> events = new CopyOnWriteArrayList<>();
    LockRegistryLeaderInitiator one = initiator(registry1, "one", events);
    LockRegistryLeaderInitiator two = initiator(registry2, "two", events);
    one.start();
    two.start();
    try {
      waitUntil(() -> events.stream().anyMatch(e -> e.startsWith("granted")));
      Thread.sleep(500);
      assertEquals(1, events.stream().filter(e -> e.startsWith("granted")).count(), events.toString());
      String first = events.get(0).substring("granted ".length());
      LockRegistryLeaderInitiator leader = first.equals("one") ? one : two;
      String other = first.equals("one") ? "two" : "one";
      Context ctx = leader.getContext();
      assertTrue(ctx.isLeader());
      ctx.yield();
      waitUntil(() -> events.contains("granted " + other));
      // Spring calls onRevoked after its unlock, so the next leader's grant may be recorded first.
      waitUntil(() -> events.contains("revoked " + first));
      assertEquals(2, events.stream().filter(e -> e.startsWith("granted")).count(), events.toString());
    } finally {
      one.stop();
      two.stop();
    }
    waitUntil(() -> redis.exists("registry-leader:leader") == 0);
    assertNull(redis.get("nothing"));
  }

  private static LockRegistryLeaderInitiator initiator(ModuleLockRegistry registry, String id, List<String> events) {
    DefaultCandidate candidate = new DefaultCandidate(id, "leader") {
      @Override
      public void onGranted(Context ctx) {
        events.add("granted " + id);
      }

      @Override
      public void onRevoked(Context ctx) {
        events.add("revoked " + id);
      }
    };
    LockRegistryLeaderInitiator initiator = new LockRegistryLeaderInitiator(registry, candidate);
    initiator.setHeartBeatMillis(100);
    initiator.setBusyWaitMillis(50);
    return initiator;
  }

  private static void waitUntil(java.util.function.BooleanSupplier cond) throws InterruptedException {
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(15);
    while (!cond.getAsBoolean()) {
      if (System.nanoTime() > end) {
        throw new AssertionError("timed out");
      }
      Thread.sleep(10);
    }
  }
}
