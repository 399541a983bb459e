package io.redislock;

import io.lettuce.core.api.sync.RedisCommands;
import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

/**
 * A Redis Cluster of three masters, each a {@link TestServer} with the module
 * loaded, slots split in three ranges, on loopback; closed with its nodes.
 */
public final class TestCluster implements AutoCloseable {
  final List<TestServer> nodes = new ArrayList<>();
  final List<String> ids = new ArrayList<>();

  private TestCluster() {}

  public static TestCluster start() throws IOException, InterruptedException {
    TestCluster c = new TestCluster();
    try {
      for (int i = 0; i < 3; i++) {
        c.nodes.add(TestServer.start(true));
      }
      int[][] ranges = {{0, 5460}, {5461, 10922}, {10923, 16383}};
      for (int i = 0; i < 3; i++) {
        RedisCommands<String, String> n = c.nodes.get(i).cmd();
        c.ids.add(n.clusterMyId());
        n.clusterAddSlots(java.util.stream.IntStream.rangeClosed(ranges[i][0], ranges[i][1]).toArray());
      }
      for (int i = 1; i < 3; i++) {
        c.nodes.get(0).cmd().clusterMeet("127.0.0.1", c.nodes.get(i).port);
      }
      TestServer.waitUntil("the cluster is up", Duration.ofSeconds(60), () -> {
        for (TestServer s : c.nodes) {
          String info = s.cmd().clusterInfo();
          if (!info.contains("cluster_state:ok") || !info.contains("cluster_known_nodes:3")) {
            return false;
          }
        }
        return true;
      });
      return c;
    } catch (IOException | InterruptedException | RuntimeException | AssertionError e) {
      c.close();
      throw e;
    }
  }

  public String url() {
    return nodes.get(0).url();
  }

  /** The node that serves {@code key}'s slot. */
  int nodeOf(String key) {
    int slot = io.lettuce.core.cluster.SlotHash.getSlot(key);
    return slot <= 5460 ? 0 : slot <= 10922 ? 1 : 2;
  }

  /** Gives {@code key}'s (empty) slot to node {@code to}, telling every node. */
  void moveSlot(String key, int to) {
    int slot = io.lettuce.core.cluster.SlotHash.getSlot(key);
    // The new owner first, then the others: each learns it from SETSLOT NODE.
    nodes.get(to).cmd().clusterSetSlotNode(slot, ids.get(to));
    for (int i = 0; i < nodes.size(); i++) {
      if (i != to) {
        nodes.get(i).cmd().clusterSetSlotNode(slot, ids.get(to));
      }
    }
  }

  @Override
  public void close() throws IOException {
    for (TestServer s : nodes) {
      s.close();
    }
  }
}
