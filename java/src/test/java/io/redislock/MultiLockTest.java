package io.redislock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** Several at once: {@link LockClient#acquireAll}, {@link DistributedMultiLock} and several permits. */
class MultiLockTest {
  static TestServer server;
  static LockClient client;

  @BeforeAll
  static void start() throws Exception {
    server = TestServer.start();
    client = LockClient.create(server.url());
  }

  @AfterAll
  static void stop() throws Exception {
    client.close();
    server.close();
  }

  private static boolean free(String key) {
    return server.infoField(key, "owner") == null && server.infoField(key, "count") == null;
  }

  private static long waiters(String key) {
    Object w = server.infoField(key, "waiters");
    return w == null ? 0 : (Long) w;
  }

  @Test
  void every_key_is_taken_with_a_fence_each_or_none() throws Exception {
    List<String> keys = List.of("m:a", "m:b", "m:c");
    Hold h = client.acquireAll(keys, LockOptions.defaults().ttl(10_000));
    assertEquals(keys, h.keys());
    List<Long> fences = h.fences();
    assertEquals(3, fences.size());
    assertTrue(fences.get(0) < fences.get(1) && fences.get(1) < fences.get(2), fences.toString());
    assertEquals(fences.get(2), h.fence());
    for (int i = 0; i < keys.size(); i++) {
      assertEquals(h.owner(), server.infoField(keys.get(i), "owner"));
      assertEquals(fences.get(i), server.infoField(keys.get(i), "fence"));
    }
    h.releaseAll();
    for (String k : keys) {
      assertTrue(free(k));
    }

    Hold other = client.acquire("m:b", LockOptions.defaults().ttl(10_000));
    assertThrows(WouldBlockException.class, () -> client.acquireAll(keys, LockOptions.defaults()));
    assertTrue(free("m:a"));
    assertTrue(free("m:c"));
    other.releaseAll();

    assertThrows(RefusedException.class, () -> client.acquireAll(List.of("x", "y", "x"), LockOptions.defaults()));
    assertThrows(RefusedException.class, () -> client.acquireAll(List.of(), LockOptions.defaults()));
  }

  @Test
  void multi_locks_on_the_same_keys_in_crossing_orders_are_served_in_turn() throws Exception {
    Hold blocker = client.acquire("x:1", LockOptions.defaults().ttl(10_000));
    DistributedMultiLock forward = client.getMultiLock("x:1", "x:2");
    DistributedMultiLock backward = client.getMultiLock("x:2", "x:1");
    CompletableFuture<Void> second = new CompletableFuture<>();
    CompletableFuture<Void> release = new CompletableFuture<>();
    Thread a = new Thread(() -> {
      forward.lock();
      try {
        release.join();
      } finally {
        forward.unlock();
      }
    });
    a.start();
    TestServer.waitUntil("the first waits", Duration.ofSeconds(5), () -> waiters("x:1") == 1);
    Thread b = new Thread(() -> {
      backward.lock();
      second.complete(null);
      backward.unlock();
    });
    b.start();
    TestServer.waitUntil("both wait", Duration.ofSeconds(5), () -> waiters("x:1") == 2);
    assertTrue(free("x:2"), "x:2 taken out of turn");
    blocker.releaseAll();
    TestServer.waitUntil("the first holds", Duration.ofSeconds(5), () -> !free("x:2"));
    Thread.sleep(200);
    assertFalse(second.isDone(), "both granted at once");
    release.complete(null);
    second.get(10, TimeUnit.SECONDS);
    a.join(5_000);
    b.join(5_000);
    TestServer.waitUntil("both free", Duration.ofSeconds(5),
        () -> free("x:1") && free("x:2"));
  }

  @Test
  void one_watchdog_keeps_every_key_and_a_lost_key_loses_the_hold() throws Exception {
    List<String> keys = List.of("w:a", "w:b");
    Hold h = client.acquireAll(keys, LockOptions.defaults().ttl(1_500).watchdog(true));
    Thread.sleep(2_500);
    assertTrue(h.isHeld());
    for (String k : keys) {
      assertFalse(free(k), k + " expired");
    }
    server.cmd().del("w:b");
    assertEquals(LossReason.NOT_OWNER, h.lost().toCompletableFuture().get(5, TimeUnit.SECONDS));
    assertFalse(h.isHeld());
  }

  @Test
  void an_interrupted_wait_holds_no_key() throws Exception {
    Hold blocker = client.acquire("i:b", LockOptions.defaults().ttl(10_000));
    DistributedMultiLock lock = client.getMultiLock("i:a", "i:b");
    Thread t = new Thread(() -> {
      try {
        lock.lockInterruptibly();
      } catch (InterruptedException e) {
        // expected
      }
    });
    t.start();
    TestServer.waitUntil("it waits", Duration.ofSeconds(5), () -> waiters("i:b") == 1);
    t.interrupt();
    t.join(5_000);
    TestServer.waitUntil("it left the queue", Duration.ofSeconds(5), () -> waiters("i:b") == 0);
    blocker.releaseAll();
    TestServer.waitUntil("every key free", Duration.ofSeconds(5),
        () -> free("i:a") && free("i:b"));
  }

  @Test
  void permits_are_one_hold_and_a_big_request_is_not_overtaken() throws Exception {
    DistributedSemaphore sem = client.getSemaphore("p", 4);
    assertThrows(RefusedException.class, () -> sem.acquire(5, LockOptions.defaults()));
    Hold first = sem.acquire(2, LockOptions.defaults().ttl(10_000));
    CompletableFuture<Hold> big = new CompletableFuture<>();
    Thread t = new Thread(() -> {
      try {
        big.complete(sem.acquire(3, LockOptions.defaults().ttl(10_000).waitMs(10_000)));
      } catch (Throwable e) {
        big.completeExceptionally(e);
      }
    });
    t.start();
    TestServer.waitUntil("the big request waits", Duration.ofSeconds(5), () -> waiters("p") == 1);
    assertNull(sem.tryAcquire(1), "a small request overtook the big one");
    sem.release(first);
    Hold three = big.get(10, TimeUnit.SECONDS);
    Hold one = sem.tryAcquire(1);
    assertNotNull(one);
    assertNull(sem.tryAcquire(1));
    sem.release(three);
    sem.release(one);
    assertTrue(free("p"));
  }
}
