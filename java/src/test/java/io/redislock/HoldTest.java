package io.redislock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** Holds taken through {@link LockClient}: tries, waits, fences, the deadline, the loss signal. */
class HoldTest {
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
  void a_try_on_a_held_lock_would_block_and_the_fence_rises_from_holder_to_holder() throws Exception {
    Hold a = client.acquire("h:try", LockOptions.defaults());
    assertEquals(a.owner(), server.infoField("h:try", "owner"));
    assertThrows(WouldBlockException.class, () -> client.acquire("h:try", LockOptions.defaults()));
    assertEquals(0, a.release());
    assertFalse(a.isHeld());
    assertNull(server.infoField("h:try", "owner"));
    Hold b = client.acquire("h:try", LockOptions.defaults());
    assertTrue(b.fence() > a.fence(), "fences rise");
    b.release();
    assertEquals(0, client.backgroundActivities());
  }

  @Test
  void a_wait_is_granted_at_the_release_and_times_out_otherwise() throws Exception {
    Hold a = client.acquire("h:wait", LockOptions.defaults());
    assertThrows(LockTimeoutException.class, () -> client.acquire("h:wait", LockOptions.defaults().waitMs(100)));
    CompletableFuture<Hold> b = CompletableFuture.supplyAsync(() -> {
      try {
        return client.acquire("h:wait", LockOptions.defaults().waitMs(10_000));
      } catch (InterruptedException e) {
        throw new IllegalStateException(e);
      }
    });
    TestServer.waitUntil("the waiter is queued", Duration.ofSeconds(5),
        () -> Long.valueOf(1).equals(server.infoField("h:wait", "waiters")));
    a.release();
    Hold got = b.get(5, TimeUnit.SECONDS);
    assertEquals(got.owner(), server.infoField("h:wait", "owner"));
    got.release();
  }

  @Test
  void the_watchdog_keeps_a_short_lease_alive() throws Exception {
    Hold a = client.acquire("h:dog", LockOptions.defaults().ttl(1000));
    Thread.sleep(2500);
    assertTrue(a.isHeld());
    assertEquals(a.owner(), server.infoField("h:dog", "owner"));
    a.release();
    assertNull(server.infoField("h:dog", "owner"));
  }

  @Test
  void without_the_watchdog_the_loss_fires_before_the_server_lease_ends() throws Exception {
    Hold a = client.acquire("h:nodog", LockOptions.defaults().ttl(1500).watchdog(false));
    long serverEnd = server.cmd().pexpiretime("h:nodog");
    // When the signal was raised, read in the callback (the test thread may see it later).
    CompletableFuture<Long> at = a.lost().thenApply(r -> System.currentTimeMillis()).toCompletableFuture();
    assertEquals(LossReason.EXPIRED, a.lost().toCompletableFuture().get(5, TimeUnit.SECONDS));
    assertTrue(at.get() <= serverEnd, "loss at " + at.get() + " after the server's lease end " + serverEnd);
    assertThrows(LockLostException.class, a::release);
  }

  @Test
  void under_client_pause_the_loss_is_signalled_before_the_server_lease_ends() throws Exception {
    Hold a = client.acquire("h:pause", LockOptions.defaults().ttl(1500));
    long serverEnd = server.cmd().pexpiretime("h:pause");
    CompletableFuture<Long> at = a.lost().thenApply(r -> System.currentTimeMillis()).toCompletableFuture();
    server.cmd().clientPause(2500);
    assertEquals(LossReason.EXPIRED, a.lost().toCompletableFuture().get(5, TimeUnit.SECONDS));
    assertTrue(at.get() <= serverEnd, "loss at " + at.get() + " after the lease end " + serverEnd);
    Thread.sleep(1500);
    // The renew that was parked behind the pause does not bring the hold back.
    assertTrue(a.isLost());
    assertFalse(a.isHeld());
  }

  @Test
  void renew_with_a_new_ttl_sets_the_lease_and_stop_watchdog_keeps_the_hold_to_its_end() throws Exception {
    Hold a = client.acquire("h:renew", LockOptions.defaults().ttl(2000).watchdog(false));
    a.renew(60_000);
    long pttl = server.cmd().pttl("h:renew");
    assertTrue(pttl > 50_000, "pttl " + pttl);
    a.renew(400);
    a.stopWatchdog();
    assertEquals(LossReason.EXPIRED, a.lost().toCompletableFuture().get(5, TimeUnit.SECONDS));
  }

  @Test
  void notowner_at_a_renew_loses_the_hold_at_once() throws Exception {
    Hold a = client.acquire("h:del", LockOptions.defaults().ttl(30_000));
    server.cmd().del("h:del");
    assertThrows(LockLostException.class, a::renew);
    assertEquals(LossReason.NOT_OWNER, a.lossReason());
  }

  @Test
  void a_hold_resumes_by_its_owner_token() throws Exception {
    Hold a = client.acquire("h:resume", LockOptions.defaults().ttl(10_000).watchdog(false));
    try (LockClient other = LockClient.create(server.url())) {
      Hold b = other.resume("h:resume", a.owner(), 10_000, null, true);
      assertEquals(a.fence(), b.fence());
      assertEquals(0, b.release());
      assertThrows(NotOwnerException.class, () -> other.resume("h:resume", a.owner(), 10_000, null, false));
    }
  }

  @Test
  void durations_up_to_2_pow_40_ms_are_accepted() throws Exception {
    Hold a = client.acquire("h:long", LockOptions.defaults().ttl(LockOptions.MAX_MS).watchdog(false));
    assertTrue(server.cmd().pttl("h:long") > (1L << 39));
    assertTrue(a.remainingMillis() > (1L << 39));
    Hold b = client.acquire("h:long2", LockOptions.defaults().ttl(1000));
    CompletableFuture<Hold> waiter = CompletableFuture.supplyAsync(() -> {
      try {
        return client.acquire("h:long2", LockOptions.defaults().waitMs(LockOptions.MAX_MS));
      } catch (InterruptedException e) {
        throw new IllegalStateException(e);
      }
    });
    TestServer.waitUntil("queued", Duration.ofSeconds(5),
        () -> Long.valueOf(1).equals(server.infoField("h:long2", "waiters")));
    b.release();
    waiter.get(5, TimeUnit.SECONDS).release();
    a.release();
    assertThrows(RefusedException.class, () -> LockOptions.defaults().ttl(LockOptions.MAX_MS + 1));
  }

  @Test
  void a_try_in_the_quarantine_says_so_and_a_wait_is_served_after_it() throws Exception {
    try (TestServer fresh = TestServer.start("--lock.max-ttl", "3000");
        LockClient c = LockClient.create(fresh.url())) {
      assertThrows(QuarantineException.class, () -> c.acquire("h:q", LockOptions.defaults().ttl(1000)));
      Hold h = c.acquire("h:q", LockOptions.defaults().ttl(1000).waitMs(10_000));
      assertTrue(h.isHeld());
      h.release();
      Hold other = c.acquire("h:q", LockOptions.defaults().ttl(1000));
      assertThrows(WouldBlockException.class, () -> c.acquire("h:q", LockOptions.defaults().ttl(1000)));
      other.release();
    }
  }

  /**
   * Redis 7.0 answers {@code CLIENT UNBLOCK … ERROR} for a command held up by
   * {@code CLIENT PAUSE WRITE} with the error, and then runs the command all
   * the same when the pause ends: a client that took the error for "nothing
   * granted" kept a 30 s hold. The wait's connection is killed instead.
   */
  @Test
  void a_wait_cancelled_while_a_write_pause_holds_it_leaves_nothing_after_the_pause() throws Exception {
    Hold warm = client.acquire("h:paused", LockOptions.defaults().ttl(1000).waitMs(1000));
    warm.release();
    server.cmd().dispatch(io.lettuce.core.protocol.CommandType.CLIENT,
        new io.lettuce.core.output.StatusOutput<>(io.lettuce.core.codec.StringCodec.UTF8),
        new io.lettuce.core.protocol.CommandArgs<>(io.lettuce.core.codec.StringCodec.UTF8).add("PAUSE").add(1500)
            .add("WRITE"));
    long paused = System.nanoTime();
    CompletableFuture<Throwable> call = new CompletableFuture<>();
    Thread waiter = new Thread(() -> {
      try {
        Hold h = client.acquire("h:paused", LockOptions.defaults().ttl(30_000).waitMs(10_000));
        call.complete(new AssertionError("granted " + h));
      } catch (Throwable e) {
        call.complete(e);
      }
    });
    waiter.start();
    Thread.sleep(300);
    waiter.interrupt();
    assertTrue(call.get(15, TimeUnit.SECONDS) instanceof InterruptedException, String.valueOf(call.getNow(null)));
    Thread.sleep(Math.max(0, 1700 - TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - paused)));
    TestServer.waitUntil("the lock is free after the pause", Duration.ofSeconds(3),
        () -> server.infoField("h:paused", "owner") == null);
  }

  @Test
  void the_async_api_is_keyed_by_owner_and_a_cancel_leaves_nothing() throws Exception {
    String owner = client.newOwner();
    Hold a = client.acquireAsync("h:async", owner, HoldKind.EXCLUSIVE, LockOptions.defaults()).get(10,
        TimeUnit.SECONDS);
    assertEquals(owner, server.infoField("h:async", "owner"));
    CompletableFuture<Hold> waiting = client.acquireAsync("h:async", client.newOwner(), HoldKind.EXCLUSIVE,
        LockOptions.defaults().waitForever());
    TestServer.waitUntil("queued", Duration.ofSeconds(10),
        () -> Long.valueOf(1).equals(server.infoField("h:async", "waiters")));
    assertTrue(waiting.cancel(true));
    TestServer.waitUntil("the waiter left", Duration.ofSeconds(10),
        () -> Long.valueOf(0).equals(server.infoField("h:async", "waiters")));
    a.release();
    assertNull(server.infoField("h:async", "owner"));
    TestServer.waitUntil("no background activity", Duration.ofSeconds(10), () -> client.backgroundActivities() == 0);
  }
}
