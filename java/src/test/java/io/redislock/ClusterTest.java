package io.redislock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.HashSet;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** The client on a three-master Redis Cluster of the module. */
class ClusterTest {
  static TestCluster cluster;

  @BeforeAll
  static void start() throws Exception {
    cluster = TestCluster.start();
  }

  @AfterAll
  static void stop() throws Exception {
    if (cluster != null) {
      cluster.close();
    }
  }

  @Test
  void each_key_is_held_on_the_node_of_its_slot_and_waits_run_there() throws Exception {
    try (LockClient client = LockClient.createCluster(cluster.url());
         LockClient other = LockClient.createCluster(cluster.url())) {
      Set<Integer> nodes = new HashSet<>();
      for (int i = 0; nodes.size() < 3; i++) {
        String key = "k" + i;
        int node = cluster.nodeOf(key);
        nodes.add(node);
        Hold h = client.acquire(key, LockOptions.defaults().ttl(10_000));
        assertNotNull(cluster.nodes.get(node).infoField(key, "owner"), key + " held on node " + node);
        // A wait on another client parks on the key's node and gets the hand-off.
        CompletableFuture<Hold> waiter = other.acquireAsync(key, other.newOwner(), HoldKind.EXCLUSIVE,
            LockOptions.defaults().ttl(10_000).waitFor(Duration.ofSeconds(20)));
        TestServer.waitUntil("the waiter is queued", Duration.ofSeconds(20),
            () -> String.valueOf(cluster.nodes.get(node).infoField(key, "waiters")).equals("1"));
        h.release();
        Hold next = waiter.get(20, TimeUnit.SECONDS);
        assertTrue(next.fence() > h.fence());
        next.release();
        // An ephemeral hold on its own connection to that node.
        Hold e = client.acquire(key, LockOptions.defaults().ephemeral(true));
        assertTrue(e.isEphemeral());
        e.release();
        assertNull(cluster.nodes.get(node).infoField(key, "owner"));
      }
    }
  }

  @Test
  void a_wait_sent_to_the_old_node_follows_moved() throws Exception {
    String key = "moved-key";
    int from = cluster.nodeOf(key);
    int to = (from + 1) % 3;
    try (LockClient client = LockClient.createCluster(cluster.url())) {
      // The client's slot map says `from`; then the slot moves without it knowing.
      assertEquals(cluster.nodes.get(from).port, client.t.nodeFor(key).getPort());
      cluster.moveSlot(key, to);
      TestServer.waitUntil("every node knows the move", Duration.ofSeconds(20), () -> {
        for (TestServer s : cluster.nodes) {
          if (!s.cmd().clusterNodes().contains(cluster.ids.get(to) + " 127.0.0.1:" + cluster.nodes.get(to).port)) {
            return false;
          }
        }
        return true;
      });
      // Another client holds it on the new node.
      TestServer dest = cluster.nodes.get(to);
      dest.cmd().dispatch(new TestServer.RawCmd("LOCK.ACQUIRE"), new io.lettuce.core.output.IntegerOutput<>(
          io.lettuce.core.codec.StringCodec.UTF8), new io.lettuce.core.protocol.CommandArgs<>(
          io.lettuce.core.codec.StringCodec.UTF8).addKey(key).add("holder").add(10_000));
      CompletableFuture<Hold> waiter = client.acquireAsync(key, client.newOwner(), HoldKind.EXCLUSIVE,
          LockOptions.defaults().ttl(10_000).waitFor(Duration.ofSeconds(20)));
      // The wait went to `from`, was answered MOVED, and now waits on `to`.
      TestServer.waitUntil("the redirected wait is queued on the new node", Duration.ofSeconds(20),
          () -> String.valueOf(dest.infoField(key, "waiters")).equals("1"));
      dest.cmd().dispatch(new TestServer.RawCmd("LOCK.RELEASE"), new io.lettuce.core.output.IntegerOutput<>(
          io.lettuce.core.codec.StringCodec.UTF8), new io.lettuce.core.protocol.CommandArgs<>(
          io.lettuce.core.codec.StringCodec.UTF8).addKey(key).add("holder"));
      Hold h = waiter.get(20, TimeUnit.SECONDS);
      assertEquals(h.owner(), String.valueOf(dest.infoField(key, "owner")));
      assertEquals(cluster.nodes.get(to).port, client.t.nodeFor(key).getPort(), "the slot map was refreshed");
      h.release();
      assertNull(dest.infoField(key, "owner"));
    }
  }
}
