package io.redislock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import org.junit.jupiter.api.Test;

/** Redlock over three real servers: the majority, the fence round, the loss, the refusals. */
class RedlockTest {
  @Test
  void a_majority_holds_it_with_one_fence_and_fences_rise_from_holder_to_holder() throws Exception {
    try (TestServer a = TestServer.start(); TestServer b = TestServer.start(); TestServer c = TestServer.start();
        Redlock redlock = Redlock.create(List.of(a.url(), b.url(), c.url()))) {
      // Server b has issued a higher fence than the others: the round raises them all to it.
      b.cmd().dispatch(new TestServer.RawCmd("LOCK.ACQUIRE"), new io.lettuce.core.output.IntegerOutput<>(
          io.lettuce.core.codec.StringCodec.UTF8), new io.lettuce.core.protocol.CommandArgs<>(
              io.lettuce.core.codec.StringCodec.UTF8).addKey("other").add("x").add(1000));
      Hold h = redlock.acquire("r:k", LockOptions.defaults().ttl(600));
      for (TestServer s : List.of(a, b, c)) {
        assertEquals(h.owner(), s.infoField("r:k", "owner"));
        assertEquals(h.fence(), s.infoField("r:k", "fence"));
      }
      assertThrows(WouldBlockException.class, () -> redlock.acquire("r:k", LockOptions.defaults()));
      Thread.sleep(1000);
      assertTrue(h.isHeld(), "the watchdog renews on the majority");
      h.release();
      for (TestServer s : List.of(a, b, c)) {
        assertNull(s.infoField("r:k", "owner"));
      }
      a.kill();
      Hold next = redlock.acquire("r:k", LockOptions.defaults().ttl(600).waitMs(2000));
      assertTrue(next.fence() > h.fence(), "a later majority shares a server with the earlier one");
      next.release();
      assertEquals(0, redlock.backgroundActivities());
    }
  }

  @Test
  void a_hold_no_majority_can_confirm_is_lost_and_ephemeral_or_even_counts_are_refused() throws Exception {
    try (TestServer a = TestServer.start(); TestServer b = TestServer.start(); TestServer c = TestServer.start();
        Redlock redlock = Redlock.create(List.of(a.url(), b.url(), c.url()))) {
      Hold h = redlock.acquire("r:lost", LockOptions.defaults().ttl(30_000));
      a.cmd().del("r:lost");
      b.cmd().del("r:lost");
      assertThrows(LockLostException.class, h::renew);
      assertEquals(LossReason.NOT_OWNER, h.lossReason());
      assertThrows(RefusedException.class,
          () -> redlock.acquire("r:eph", LockOptions.defaults().ephemeral(true)));
      assertThrows(RefusedException.class, () -> Redlock.create(List.of(a.url(), b.url())));
    }
  }
}
