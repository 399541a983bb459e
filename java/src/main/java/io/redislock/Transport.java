package io.redislock;

import io.lettuce.core.ClientOptions;
import io.lettuce.core.RedisChannelHandler;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisConnectionStateListener;
import io.lettuce.core.RedisURI;
import io.lettuce.core.KillArgs;
import io.lettuce.core.api.StatefulConnection;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.cluster.ClusterClientOptions;
import io.lettuce.core.cluster.RedisClusterClient;
import io.lettuce.core.cluster.SlotHash;
import io.lettuce.core.cluster.api.StatefulRedisClusterConnection;
import io.lettuce.core.cluster.api.async.RedisClusterAsyncCommands;
import io.lettuce.core.cluster.models.partitions.RedisClusterNode;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.event.command.CommandFailedEvent;
import io.lettuce.core.event.command.CommandListener;
import io.lettuce.core.protocol.ProtocolVersion;
import io.lettuce.core.resource.ClientResources;
import io.lettuce.core.resource.DefaultClientResources;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedDeque;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Where commands go. One shared, multiplexed connection (Lettuce's, which
 * reconnects by itself) carries the short commands: tries, renewals,
 * reentries, releases. Waits and ephemeral holds each take a dedicated
 * connection from a small pool: a parked {@code WAIT} would block every
 * command pipelined behind it on a shared one, and an ephemeral hold ends
 * when its connection closes, so its connection must not reconnect by itself
 * nor serve anyone else.
 *
 * <p>On a Redis Cluster the shared connection is Lettuce's cluster
 * connection (it routes each command by its key's slot and follows
 * {@code MOVED}/{@code ASK}); a dedicated connection is opened to the node
 * that serves the key's slot, and a wait redirected from it moves to another
 * (the caller follows the redirect).
 *
 * <p>The role check (a Sentinel's master that became a replica): a
 * {@code READONLY}, {@code NOREPLICAS} or {@code MASTERDOWN} reply on any
 * connection drops the idle dedicated connections and those in use once
 * given back, and the shared connection, which Lettuce then makes again,
 * asking the Sentinel for the master again.
 *
 * <p>Also the client's clock and timers: a scheduler of daemon threads arms
 * every deadline and renewal, in steps of at most a day (a lease may be 2^40
 * ms), and {@link #activities} counts what is still running in the background.
 */
final class Transport implements AutoCloseable {
  /** Dedicated connections kept idle for the next wait. */
  private static final int IDLE_MAX = 8;
  private static final long STEP_NANOS = TimeUnit.DAYS.toNanos(1);

  private final ClientResources resources;
  private final boolean ownResources;
  /** One server (or a Sentinel's master): null on a cluster. */
  private final RedisClient sharedClient;
  /** A cluster: null on one server. */
  private final RedisClusterClient clusterClient;
  private final StatefulRedisClusterConnection<String, String> cluster;
  private final RedisClient dedicatedClient;
  private final StatefulConnection<String, String> sharedConn;
  /** The shared connection's commands: one server's, or the cluster's (routed by key). */
  final RedisClusterAsyncCommands<String, String> shared;
  /** Idle dedicated connections per node ({@code host:port}). */
  private final ConcurrentHashMap<String, ConcurrentLinkedDeque<Dedicated>> idle = new ConcurrentHashMap<>();
  private final ScheduledThreadPoolExecutor scheduler;
  /** Watchdogs, deadline timers, background releases and cancel clean-ups alive now. */
  final AtomicInteger activities = new AtomicInteger();
  /** How long a command other than a wait may take before it counts as failed. */
  final long replyTimeoutNanos;
  private final RedisURI uri;
  /** Bumped by each role loss: dedicated connections made before it are closed when given back. */
  private final AtomicInteger roleEpoch = new AtomicInteger();
  private final AtomicBoolean droppingShared = new AtomicBoolean();

  Transport(RedisURI uri, ClientResources given, Duration replyTimeout) {
    this(uri, given, replyTimeout, false);
  }

  /** {@code clustered}: {@code uri} is any node of a Redis Cluster. */
  Transport(RedisURI uri, ClientResources given, Duration replyTimeout, boolean clustered) {
    this.uri = uri;
    this.ownResources = given == null;
    this.resources = given != null ? given : DefaultClientResources.builder().build();
    this.replyTimeoutNanos = replyTimeout.toNanos();
    // While it reconnects, commands fail at once rather than queue: a renew is
    // retried by the watchdog, a release in the background, and a Redlock
    // round counts the server out.
    if (clustered) {
      this.sharedClient = null;
      this.clusterClient = RedisClusterClient.create(resources, uri);
      // Lettuce's cluster connection opens its node connections lazily and would
      // reject the first command to a node while that connection comes up: there
      // commands wait for it (every caller awaits with the reply timeout).
      clusterClient.setOptions(ClusterClientOptions.builder().protocolVersion(ProtocolVersion.RESP2)
          .autoReconnect(true).disconnectedBehavior(ClientOptions.DisconnectedBehavior.ACCEPT_COMMANDS).build());
    } else {
      this.clusterClient = null;
      this.sharedClient = RedisClient.create(resources, uri);
      sharedClient.setOptions(ClientOptions.builder().protocolVersion(ProtocolVersion.RESP2).autoReconnect(true)
          .disconnectedBehavior(ClientOptions.DisconnectedBehavior.REJECT_COMMANDS).build());
    }
    this.dedicatedClient = RedisClient.create(resources, uri);
    dedicatedClient.setOptions(ClientOptions.builder().protocolVersion(ProtocolVersion.RESP2).autoReconnect(false)
        .disconnectedBehavior(ClientOptions.DisconnectedBehavior.REJECT_COMMANDS).build());
    if (!clustered) {
      CommandListener roleCheck = new CommandListener() {
        @Override
        public void commandFailed(CommandFailedEvent event) {
          if (refusesWrites(event.getCause())) {
            roleLost();
          }
        }
      };
      sharedClient.addListener(roleCheck);
      dedicatedClient.addListener(roleCheck);
    }
    this.scheduler = new ScheduledThreadPoolExecutor(2, r -> {
      Thread t = new Thread(r, "redislock-timer");
      t.setDaemon(true);
      return t;
    });
    scheduler.setRemoveOnCancelPolicy(true);
    try {
      if (clustered) {
        this.cluster = clusterClient.connect(StringCodec.UTF8);
        this.sharedConn = cluster;
        this.shared = cluster.async();
      } else {
        StatefulRedisConnection<String, String> conn = sharedClient.connect(StringCodec.UTF8);
        this.cluster = null;
        this.sharedConn = conn;
        this.shared = conn.async();
      }
    } catch (RuntimeException e) {
      shutdownQuietly();
      throw Protocol.map(e);
    }
    if (!clustered) {
      // One dedicated connection opened now, in the background, so the first
      // wait does not pay for a connection while its caller waits.
      CompletableFuture.runAsync(() -> {
        try {
          giveBack(takeDedicated(uri, false));
        } catch (InterruptedException | RuntimeException e) {
          // The first wait opens its own.
        }
      });
    }
  }

  /** A reply saying this server takes no writes now: it is a replica, or cut off from its replicas. */
  static boolean refusesWrites(Throwable err) {
    Throwable e = Protocol.unwrap(err);
    String m = e == null || e.getMessage() == null ? "" : e.getMessage();
    return m.startsWith("READONLY") || m.startsWith("NOREPLICAS") || m.startsWith("MASTERDOWN");
  }

  /**
   * The server stopped being a master: no connection to it is used again.
   * Runs on Lettuce's event loop, so it only starts things.
   */
  void roleLost() {
    roleEpoch.incrementAndGet();
    for (ConcurrentLinkedDeque<Dedicated> pool : idle.values()) {
      for (Dedicated d; (d = pool.pollFirst()) != null; ) {
        d.conn.closeAsync();
      }
    }
    if (cluster == null && droppingShared.compareAndSet(false, true)) {
      // The server closes the shared connection; Lettuce reconnects, resolving the master anew.
      shared.clientId().toCompletableFuture()
          .thenCompose(id -> shared.clientKill(KillArgs.Builder.id(id).skipme(false)).toCompletableFuture())
          .whenComplete((x, e) -> droppingShared.set(false));
    }
  }

  boolean isCluster() {
    return cluster != null;
  }

  /** The node that serves {@code key}: the server itself, or the cluster node of its slot as last known. */
  RedisURI nodeFor(String key) {
    if (cluster == null) {
      return uri;
    }
    RedisClusterNode n = clusterClient.getPartitions().getPartitionBySlot(SlotHash.getSlot(key));
    if (n == null) {
      refreshTopology();
      n = clusterClient.getPartitions().getPartitionBySlot(SlotHash.getSlot(key));
    }
    return n == null ? uri : node(n.getUri().getHost(), n.getUri().getPort());
  }

  /** The seed's settings (credentials, timeouts) for another node. */
  RedisURI node(String host, int port) {
    return RedisURI.builder(uri).withHost(host).withPort(port).build();
  }

  /** A {@code MOVED} reply: the slot map changed; the next {@link #nodeFor} sees the new one. */
  void refreshTopology() {
    if (clusterClient != null) {
      try {
        clusterClient.refreshPartitions();
      } catch (RuntimeException e) {
        // The redirect itself names the node; the map is refreshed again later.
      }
    }
  }

  /** {@code CLIENT KILL ID} of a dedicated connection, sent to the node it is on. */
  CompletableFuture<Long> kill(Dedicated d) {
    KillArgs id = KillArgs.Builder.id(d.clientId);
    if (cluster == null) {
      return shared.clientKill(id).toCompletableFuture();
    }
    return cluster.getConnectionAsync(d.node.getHost(), d.node.getPort())
        .thenCompose(c -> c.async().clientKill(id).toCompletableFuture());
  }

  /** {@code INFO section} of the node that serves {@code key}. */
  CompletableFuture<String> info(String key, String section) {
    if (cluster == null) {
      return shared.info(section).toCompletableFuture();
    }
    RedisURI n = nodeFor(key);
    return cluster.getConnectionAsync(n.getHost(), n.getPort())
        .thenCompose(c -> c.async().info(section).toCompletableFuture());
  }

  /** A connection of its own, for one wait or one ephemeral hold. */
  static final class Dedicated {
    final StatefulRedisConnection<String, String> conn;
    /** {@code CLIENT ID}: what {@code CLIENT UNBLOCK} names to wake its wait. */
    final long clientId;
    /** The server it is connected to. */
    final RedisURI node;
    /** The role epoch it was made in. */
    final int epoch;
    private volatile boolean closed;
    private volatile Runnable onClose;

    Dedicated(StatefulRedisConnection<String, String> conn, long clientId, RedisURI node, int epoch) {
      this.conn = conn;
      this.clientId = clientId;
      this.node = node;
      this.epoch = epoch;
    }

    RedisClusterAsyncCommands<String, String> commands() {
      return conn.async();
    }

    boolean isOpen() {
      return !closed && conn.isOpen();
    }

    /** Runs {@code r} once when the connection closes (at once if it already has). */
    void onClose(Runnable r) {
      onClose = r;
      if (!isOpen()) {
        fireClosed();
      }
    }

    void fireClosed() {
      closed = true;
      Runnable r = onClose;
      onClose = null;
      if (r != null) {
        r.run();
      }
    }
  }

  /**
   * A dedicated connection: an idle one, or a new one. Interruptible: a
   * connection still being made when the caller is interrupted is closed
   * once it is up.
   */
  Dedicated takeDedicated(String key, boolean interruptible) throws InterruptedException {
    return takeDedicated(nodeFor(key), interruptible);
  }

  /** As {@link #takeDedicated(String, boolean)}, to the server {@code node}. */
  Dedicated takeDedicated(RedisURI node, boolean interruptible) throws InterruptedException {
    ConcurrentLinkedDeque<Dedicated> pool = idle.get(hostPort(node));
    for (Dedicated d; pool != null && (d = pool.pollFirst()) != null; ) {
      if (d.isOpen()) {
        return d;
      }
      d.conn.closeAsync();
    }
    int epoch = roleEpoch.get();
    CompletableFuture<StatefulRedisConnection<String, String>> connecting =
        dedicatedClient.connectAsync(StringCodec.UTF8, node).toCompletableFuture();
    CompletableFuture<Dedicated> made = connecting.thenCompose(conn -> conn.async().clientId().toCompletableFuture()
        .handle((id, err) -> {
          if (err != null) {
            conn.closeAsync();
            throw new java.util.concurrent.CompletionException(err);
          }
          return new Dedicated(conn, id, node, epoch);
        }));
    try {
      Dedicated d = await(made, replyTimeoutNanos, interruptible);
      d.conn.addListener(new RedisConnectionStateListener() {
        @Override
        public void onRedisDisconnected(RedisChannelHandler<?, ?> connection) {
          d.fireClosed();
        }
      });
      return d;
    } catch (InterruptedException e) {
      made.thenAccept(d -> d.conn.closeAsync());
      throw e;
    } catch (TimeoutException e) {
      made.thenAccept(d -> d.conn.closeAsync());
      throw new TransportException("no connection in time", e);
    } catch (ExecutionException e) {
      throw Protocol.map(e);
    }
  }

  /** Back to the pool once its command is answered and nothing is bound to it; else closed. */
  void giveBack(Dedicated d) {
    d.onClose = null;
    ConcurrentLinkedDeque<Dedicated> pool = idle.computeIfAbsent(hostPort(d.node), k -> new ConcurrentLinkedDeque<>());
    if (d.isOpen() && d.epoch == roleEpoch.get() && pool.size() < IDLE_MAX) {
      pool.addFirst(d);
    } else {
      d.conn.closeAsync();
    }
  }

  private static String hostPort(RedisURI node) {
    return node.getHost() + ":" + node.getPort();
  }

  void close(Dedicated d) {
    d.onClose = null;
    d.conn.closeAsync();
  }

  /**
   * Runs {@code task} after {@code delayNanos}. A delay longer than a day is
   * armed in steps: the task must check the clock itself and re-arm (every
   * caller does, as a deadline may also have moved meanwhile).
   */
  ScheduledFuture<?> schedule(Runnable task, long delayNanos) {
    long step = Math.max(0, Math.min(delayNanos, STEP_NANOS));
    return scheduler.schedule(task, step, TimeUnit.NANOSECONDS);
  }

  void execute(Runnable task) {
    scheduler.execute(task);
  }

  /**
   * Waits for {@code f}: at most {@code timeoutNanos} (negative: no limit),
   * interruptibly or not. Not interruptible, an interrupt is remembered and
   * set again on return.
   */
  static <T> T await(CompletableFuture<T> f, long timeoutNanos, boolean interruptible)
      throws InterruptedException, ExecutionException, TimeoutException {
    boolean interrupted = false;
    long end = System.nanoTime() + timeoutNanos;
    try {
      for (;;) {
        try {
          if (timeoutNanos < 0) {
            return f.get();
          }
          long left = end - System.nanoTime();
          if (left <= 0 && !f.isDone()) {
            throw new TimeoutException();
          }
          return f.get(Math.max(0, left), TimeUnit.NANOSECONDS);
        } catch (InterruptedException e) {
          if (interruptible) {
            throw e;
          }
          interrupted = true;
        }
      }
    } finally {
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }
  }

  /** Waits for {@code f} up to {@code timeoutNanos}, ignoring interrupts and failures; whether it completed. */
  static boolean settle(CompletableFuture<?> f, long timeoutNanos) {
    try {
      await(f, timeoutNanos, false);
      return true;
    } catch (ExecutionException e) {
      return true;
    } catch (TimeoutException | InterruptedException e) {
      return f.isDone();
    }
  }

  /** Counts a background activity until {@code f} completes. */
  void track(CompletableFuture<?> f) {
    activities.incrementAndGet();
    f.whenComplete((v, e) -> activities.decrementAndGet());
  }

  @Override
  public void close() {
    for (ConcurrentLinkedDeque<Dedicated> pool : idle.values()) {
      for (Dedicated d; (d = pool.pollFirst()) != null; ) {
        d.conn.close();
      }
    }
    sharedConn.close();
    shutdownQuietly();
  }

  private void shutdownQuietly() {
    scheduler.shutdownNow();
    if (sharedClient != null) {
      sharedClient.shutdown(Duration.ZERO, Duration.ofSeconds(2));
    }
    if (clusterClient != null) {
      clusterClient.shutdown(Duration.ZERO, Duration.ofSeconds(2));
    }
    dedicatedClient.shutdown(Duration.ZERO, Duration.ofSeconds(2));
    if (ownResources) {
      resources.shutdown(0, 2, TimeUnit.SECONDS);
    }
  }
}
