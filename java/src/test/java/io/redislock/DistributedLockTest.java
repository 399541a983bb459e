package io.redislock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** {@link DistributedLock}: the {@code java.util.concurrent.locks.Lock} contract on real servers. */
class DistributedLockTest {
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

  @Test
  void threads_contending_never_overlap_and_fences_rise_in_grant_order() throws Exception {
    DistributedLock lock = client.getLock("l:contend");
    int threads = 6;
    int rounds = 15;
    List<Long> fences = new ArrayList<>();
    int[] inside = {0};
    AtomicReference<Throwable> failure = new AtomicReference<>();
    List<Thread> workers = new ArrayList<>();
    for (int i = 0; i < threads; i++) {
      Thread w = new Thread(() -> {
        try {
          for (int r = 0; r < rounds; r++) {
            lock.lock();
            try {
              synchronized (fences) {
                inside[0]++;
                assertEquals(1, inside[0], "two threads inside at once");
                fences.add(lock.getFence());
              }
              Thread.sleep(1);
              synchronized (fences) {
                inside[0]--;
              }
            } finally {
              lock.unlock();
            }
          }
        } catch (Throwable e) {
          failure.compareAndSet(null, e);
        }
      });
      workers.add(w);
      w.start();
    }
    for (Thread w : workers) {
      w.join(60_000);
    }
    if (failure.get() != null) {
      throw new AssertionError(failure.get());
    }
    assertEquals(threads * rounds, fences.size());
    for (int i = 1; i < fences.size(); i++) {
      assertTrue(fences.get(i) > fences.get(i - 1), "fences rise in grant order");
    }
    assertFalse(lock.isLocked());
  }

  @Test
  void reentrant_per_thread_and_unlock_by_another_thread_is_refused() throws Exception {
    DistributedLock lock = client.getLock("l:reenter");
    lock.lock();
    long fence = lock.getFence();
    // Another handle of the same name on the same thread is the same owner, as Redisson's.
    DistributedLock again = client.getLock("l:reenter");
    assertTrue(again.tryLock());
    assertEquals(2, lock.getHoldCount());
    assertEquals(Long.valueOf(2), server.infoField("l:reenter", "count"));
    assertEquals(fence, again.getFence());
    CompletableFuture<Throwable> other = CompletableFuture.supplyAsync(() -> {
      try {
        lock.unlock();
        return null;
      } catch (Throwable e) {
        return e;
      }
    });
    assertTrue(other.get(5, TimeUnit.SECONDS) instanceof IllegalMonitorStateException);
    CompletableFuture<Boolean> otherTry = CompletableFuture.supplyAsync(lock::tryLock);
    assertFalse(otherTry.get(5, TimeUnit.SECONDS));
    lock.unlock();
    assertTrue(lock.isHeldByCurrentThread());
    lock.unlock();
    assertFalse(lock.isHeldByCurrentThread());
    assertEquals(0, lock.getHoldCount());
    assertNull(server.infoField("l:reenter", "owner"));
    assertThrows(IllegalMonitorStateException.class, lock::unlock);
  }

  @Test
  void a_lease_ends_the_hold_without_a_watchdog() throws Exception {
    DistributedLock lock = client.getLock("l:lease");
    assertTrue(lock.tryLock(1, 400, TimeUnit.MILLISECONDS));
    long ttl = lock.remainTimeToLive();
    assertTrue(ttl > 0 && ttl <= 400, "ttl " + ttl);
    Hold h = lock.getHold();
    assertEquals(LossReason.EXPIRED, h.lost().toCompletableFuture().get(5, TimeUnit.SECONDS));
    TestServer.waitUntil("the key is gone", Duration.ofSeconds(5), () -> lock.remainTimeToLive() == -2);
    assertFalse(lock.isHeldByCurrentThread());
    assertThrows(LockLostException.class, lock::unlock);
    assertTrue(lock.tryLock());
    lock.unlock();
  }

  @Test
  void a_thread_interrupted_while_it_waits_holds_nothing_and_leaves_the_queue() throws Exception {
    DistributedLock lock = client.getLock("l:intr");
    lock.lock();
    AtomicReference<Throwable> got = new AtomicReference<>();
    Thread waiter = new Thread(() -> {
      try {
        lock.lockInterruptibly();
      } catch (Throwable e) {
        got.set(e);
      }
    });
    waiter.start();
    TestServer.waitUntil("queued", Duration.ofSeconds(10),
        () -> Long.valueOf(1).equals(server.infoField("l:intr", "waiters")));
    waiter.interrupt();
    waiter.join(10_000);
    assertTrue(got.get() instanceof InterruptedException, String.valueOf(got.get()));
    assertEquals(Long.valueOf(0), server.infoField("l:intr", "waiters"));
    lock.unlock();
    assertNull(server.infoField("l:intr", "owner"));
  }

  @Test
  void an_interrupt_at_any_point_leaves_no_hold_behind() throws Exception {
    // The holder lets go at a moment that moves across the interrupt's, so the
    // interrupt lands before the send, while parked, as the grant crosses, and after.
    DistributedLock holder = client.getLock("l:every");
    DistributedLock lock = client.getLock("l:every", "other-scope");
    int granted = 0;
    for (int i = 0; i < 24; i++) {
      CountDownLatch held = new CountDownLatch(1);
      CountDownLatch letGo = new CountDownLatch(1);
      Thread h = new Thread(() -> {
        holder.lock();
        held.countDown();
        try {
          letGo.await();
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
        holder.unlock();
      });
      h.start();
      held.await();
      AtomicReference<Object> outcome = new AtomicReference<>();
      CountDownLatch done = new CountDownLatch(1);
      Thread w = new Thread(() -> {
        try {
          outcome.set(lock.tryLock(10, TimeUnit.SECONDS));
          if (Boolean.TRUE.equals(outcome.get())) {
            outcome.set(lock.getHold());
          }
        } catch (Throwable e) {
          outcome.set(e);
        }
        done.countDown();
      });
      w.start();
      Thread.sleep(i % 6 == 0 ? 0 : 2 + (i % 5));
      letGo.countDown();
      Thread.sleep(i % 4);
      w.interrupt();
      assertTrue(done.await(15, TimeUnit.SECONDS));
      h.join();
      Object o = outcome.get();
      if (o instanceof Hold) {
        granted++;
        Hold got = (Hold) o;
        assertEquals(got.owner(), server.infoField("l:every", "owner"));
        got.release();
      } else {
        assertTrue(o instanceof InterruptedException, String.valueOf(o));
      }
      TestServer.waitUntil("the lock is free", Duration.ofSeconds(5),
          () -> server.infoField("l:every", "owner") == null);
      assertEquals(Long.valueOf(0), server.infoField("l:every", "waiters") == null ? 0L
          : server.infoField("l:every", "waiters"));
    }
    System.out.println("interrupt at any point: " + granted + " of 24 got the lock before the interrupt");
    TestServer.waitUntil("no background activity", Duration.ofSeconds(10), () -> client.backgroundActivities() == 0);
  }

  @Test
  void the_watchdog_survives_a_killed_shared_connection() throws Exception {
    DistributedLock lock = client.getLock("l:kill");
    lock.acquire(LockOptions.defaults().ttl(3000));
    server.cmd().clientKill(io.lettuce.core.KillArgs.Builder.typeNormal().skipme(true));
    Thread.sleep(4000);
    assertTrue(lock.isHeldByCurrentThread(), "renewed after the reconnect");
    assertEquals(lock.getHold().owner(), server.infoField("l:kill", "owner"));
    lock.unlock();
  }

  @Test
  void an_ephemeral_hold_is_lost_when_its_connection_is_killed() throws Exception {
    DistributedLock lock = client.getLock("l:eph");
    Hold h = lock.acquire(LockOptions.defaults().ephemeral(true));
    assertTrue(h.isEphemeral());
    server.cmd().clientKill(io.lettuce.core.KillArgs.Builder.id(h.connectionId()));
    assertEquals(LossReason.DISCONNECTED, h.lost().toCompletableFuture().get(2, TimeUnit.SECONDS));
    assertNull(server.infoField("l:eph", "owner"));
    assertTrue(lock.tryLock(), "a fresh hold after the loss");
    assertNotNull(lock.getHold());
    assertTrue(lock.getHold() != h);
    assertEquals(LossReason.DISCONNECTED, h.lossReason(), "the new hold does not clear the old loss");
    lock.unlock();
  }

  @Test
  void a_release_that_does_not_complete_reports_the_loss_and_lands_later() throws Exception {
    Hold h = client.acquire("l:unconfirmed", LockOptions.defaults().ttl(20_000));
    server.cmd().clientPause(800);
    Thread me = Thread.currentThread();
    CompletableFuture.runAsync(() -> {
      try {
        Thread.sleep(100);
      } catch (InterruptedException e) {
        return;
      }
      me.interrupt();
    });
    assertThrows(InterruptedException.class, h::release);
    assertEquals(LossReason.RELEASE_UNCONFIRMED, h.lossReason());
    assertFalse(h.isHeld());
    TestServer.waitUntil("the background release landed", Duration.ofSeconds(10),
        () -> server.infoField("l:unconfirmed", "owner") == null);
    TestServer.waitUntil("no background activity", Duration.ofSeconds(10), () -> client.backgroundActivities() == 0);
  }

  @Test
  void readers_share_the_writer_may_read_and_a_reader_may_not_write() throws Exception {
    DistributedReadWriteLock rw = client.getReadWriteLock("l:rw");
    rw.readLock().lock();
    CompletableFuture<Boolean> otherReader = CompletableFuture.supplyAsync(() -> {
      boolean got = rw.readLock().tryLock();
      if (got) {
        rw.readLock().unlock();
      }
      return got;
    });
    assertTrue(otherReader.get(5, TimeUnit.SECONDS));
    long t0 = System.nanoTime();
    assertThrows(UpgradeRefusedException.class, () -> rw.writeLock().tryLock(5, TimeUnit.SECONDS));
    assertTrue(System.nanoTime() - t0 < TimeUnit.SECONDS.toNanos(2), "refused at once, not queued");
    rw.readLock().unlock();
    rw.writeLock().lock();
    rw.readLock().lock();
    assertEquals(2, rw.writeLock().getHoldCount());
    assertEquals("exclusive", String.valueOf(server.infoField("l:rw", "mode")));
    CompletableFuture<Boolean> blockedReader = CompletableFuture.supplyAsync(rw.readLock()::tryLock);
    assertFalse(blockedReader.get(5, TimeUnit.SECONDS));
    rw.readLock().unlock();
    rw.writeLock().unlock();
    assertNull(server.infoField("l:rw", "owner"));
  }

  @Test
  void a_semaphore_gives_each_permit_its_own_fence_and_queues_the_rest() throws Exception {
    DistributedSemaphore sem = client.getSemaphore("l:sem", 2);
    Hold a = sem.tryAcquire();
    Hold b = sem.tryAcquire();
    assertNotNull(a);
    assertNotNull(b);
    assertTrue(b.fence() > a.fence());
    assertNull(sem.tryAcquire());
    assertThrows(LimitMismatchException.class, () -> client.getSemaphore("l:sem", 3).tryAcquire());
    CompletableFuture<Hold> third = CompletableFuture.supplyAsync(() -> {
      try {
        return sem.tryAcquire(10, 5, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        throw new IllegalStateException(e);
      }
    });
    TestServer.waitUntil("queued", Duration.ofSeconds(5),
        () -> Long.valueOf(1).equals(server.infoField("l:sem", "waiters")));
    sem.release(a.owner());
    Hold c = third.get(10, TimeUnit.SECONDS);
    assertNotNull(c);
    assertTrue(c.fence() > b.fence());
    sem.release(b);
    sem.release(c);
    assertNull(server.infoField("l:sem", "count"));
  }
}
