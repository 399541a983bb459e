package io.redislock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.sentinel.api.StatefulRedisSentinelConnection;
import io.lettuce.core.sentinel.api.sync.RedisSentinelCommands;
import java.io.IOException;
import java.net.ServerSocket;
import java.net.SocketAddress;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;

/**
 * A master and a replica of the module, a Sentinel watching them, and the
 * client on the Sentinel's URL: after a failover, the connections to the old
 * master (now a replica, answering {@code READONLY}) are dropped and the next
 * holds and waits land on the promoted master.
 */
class SentinelTest {
  /**
   * The role check alone, without a Sentinel (whose failover also kills the
   * old master's clients): a server turned replica answers {@code READONLY};
   * that reply drops the shared connection (Lettuce makes a new one) and the
   * idle dedicated ones.
   */
  @Test
  void a_readonly_reply_drops_the_connections_to_that_server() throws Exception {
    try (TestServer other = TestServer.start(); TestServer server = TestServer.start();
         LockClient client = LockClient.create(server.url())) {
      client.acquire("warm", LockOptions.defaults().waitFor(Duration.ofSeconds(5))).release();
      long sharedId = Transport.await(client.t.shared.clientId().toCompletableFuture(), -1, false);
      TestServer.waitUntil("an idle dedicated connection", Duration.ofSeconds(10),
          () -> server.cmd().clientList().lines().count() >= 3);
      server.cmd().replicaof("127.0.0.1", other.port);
      TestServer.waitUntil("the server refuses writes", Duration.ofSeconds(20), () -> {
        try {
          client.acquire("k", LockOptions.defaults());
          return false;
        } catch (TransportException e) {
          return String.valueOf(e.getMessage()).contains("READONLY");
        } catch (InterruptedException e) {
          throw new AssertionError(e);
        }
      });
      TestServer.waitUntil("the shared connection is a new one and no dedicated one is left",
          Duration.ofSeconds(20), () -> {
            String list = server.cmd().clientList();
            // Left: this test's observer and the client's new shared connection.
            return !list.contains("id=" + sharedId + " ") && list.lines().count() == 2;
          });
    }
  }

  @Test
  void after_a_failover_holds_and_waits_land_on_the_promoted_master() throws Exception {
    try (TestServer master = TestServer.start();
         TestServer replica = TestServer.start("--replicaof", "127.0.0.1", String.valueOf(master.port))) {
      int sentinelPort;
      try (ServerSocket s = new ServerSocket(0)) {
        sentinelPort = s.getLocalPort();
      }
      Path dir = Files.createTempDirectory("redislock-sentinel-");
      Path conf = dir.resolve("sentinel.conf");
      Files.writeString(conf, "port " + sentinelPort + "\nbind 127.0.0.1\ndir " + dir + "\nlogfile "
          + dir.resolve("sentinel.log") + "\nsentinel monitor mymaster 127.0.0.1 " + master.port + " 1\n"
          + "sentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 5000\n");
      Process sentinel = new ProcessBuilder(System.getenv().getOrDefault("LOCK_SERVER", "redis-server"),
          conf.toString(), "--sentinel").redirectErrorStream(true).redirectOutput(dir.resolve("out.log").toFile())
          .start();
      RedisClient sc = RedisClient.create();
      try {
        AtomicReference<StatefulRedisSentinelConnection<String, String>> conn = new AtomicReference<>();
        TestServer.waitUntil("the Sentinel is up", Duration.ofSeconds(20), () -> {
          try {
            conn.set(sc.connectSentinel(RedisURI.create("127.0.0.1", sentinelPort)));
            return true;
          } catch (RuntimeException e) {
            return false;
          }
        });
        RedisSentinelCommands<String, String> s = conn.get().sync();
        TestServer.waitUntil("the Sentinel knows the replica", Duration.ofSeconds(30),
            () -> s.replicas("mymaster").size() == 1);
        try (LockClient client = LockClient.create("redis-sentinel://127.0.0.1:" + sentinelPort + "#mymaster")) {
          Hold before = client.acquire("before", LockOptions.defaults().ttl(10_000));
          assertEquals(before.owner(), String.valueOf(master.infoField("before", "owner")));
          before.release();

          // The Sentinel refuses (NOGOODSLAVE) until it has heard from the replica itself.
          TestServer.waitUntil("the Sentinel starts a failover", Duration.ofSeconds(30), () -> {
            try {
              s.failover("mymaster");
              return true;
            } catch (RuntimeException e) {
              if (!String.valueOf(e.getMessage()).contains("NOGOODSLAVE")) {
                throw e;
              }
              return false;
            }
          });
          TestServer.waitUntil("the replica is promoted and the old master follows it", Duration.ofSeconds(30),
              () -> {
                try {
                  SocketAddress a = s.getMasterAddrByName("mymaster");
                  return a.toString().endsWith(":" + replica.port)
                      && replica.cmd().info("replication").contains("role:master")
                      && master.cmd().info("replication").contains("role:slave");
                } catch (RuntimeException e) {
                  // The Sentinel closes the servers' clients (this test's too) as it
                  // reconfigures them: ask again.
                  return false;
                }
              });
          // The old master answers READONLY: that drops the client's connections
          // to it, and a later call finds the new master through the Sentinel.
          AtomicReference<Hold> after = new AtomicReference<>();
          TestServer.waitUntil("a hold on the promoted master", Duration.ofSeconds(30), () -> {
            try {
              after.set(client.acquire("after", LockOptions.defaults().ttl(10_000)));
              return true;
            } catch (TransportException e) {
              return false;
            } catch (InterruptedException e) {
              throw new AssertionError(e);
            }
          });
          assertEquals(after.get().owner(), String.valueOf(replica.infoField("after", "owner")));
          after.get().release();
          // A wait now: the dedicated connections to the old master were dropped.
          Hold waited = client.acquire("after-wait", LockOptions.defaults().ttl(10_000)
              .waitFor(Duration.ofSeconds(5)));
          assertNotNull(replica.infoField("after-wait", "owner"));
          waited.release();
        }
      } finally {
        sc.shutdown();
        sentinel.destroyForcibly().waitFor();
        deleteTree(dir);
      }
    }
  }

  private static void deleteTree(Path dir) throws IOException {
    try (var files = Files.walk(dir)) {
      files.sorted(java.util.Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
    }
  }
}
