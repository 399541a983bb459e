package io.redislock;

import io.lettuce.core.ClientOptions;
import io.lettuce.core.RedisChannelHandler;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisConnectionStateListener;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.protocol.ProtocolVersion;
import io.lettuce.core.resource.ClientResources;
import io.lettuce.core.resource.DefaultClientResources;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentLinkedDeque;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
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
  private final RedisClient sharedClient;
  private final RedisClient dedicatedClient;
  final StatefulRedisConnection<String, String> shared;
  private final ConcurrentLinkedDeque<Dedicated> idle = new ConcurrentLinkedDeque<>();
  private final ScheduledThreadPoolExecutor scheduler;
  /** Watchdogs, deadline timers, background releases and cancel clean-ups alive now. */
  final AtomicInteger activities = new AtomicInteger();
  /** How long a command other than a wait may take before it counts as failed. */
  final long replyTimeoutNanos;
  private final RedisURI uri;

  Transport(RedisURI uri, ClientResources given, Duration replyTimeout) {
    this.uri = uri;
    this.ownResources = given == null;
    this.resources = given != null ? given : DefaultClientResources.builder().build();
    this.replyTimeoutNanos = replyTimeout.toNanos();
    this.sharedClient = RedisClient.create(resources, uri);
    // While it reconnects, commands fail at once rather than queue: a renew is
    // retried by the watchdog, a release in the background, and a Redlock
    // round counts the server out.
    sharedClient.setOptions(ClientOptions.builder().protocolVersion(ProtocolVersion.RESP2).autoReconnect(true)
        .disconnectedBehavior(ClientOptions.DisconnectedBehavior.REJECT_COMMANDS).build());
    this.dedicatedClient = RedisClient.create(resources, uri);
    dedicatedClient.setOptions(ClientOptions.builder().protocolVersion(ProtocolVersion.RESP2).autoReconnect(false)
        .disconnectedBehavior(ClientOptions.DisconnectedBehavior.REJECT_COMMANDS).build());
    this.scheduler = new ScheduledThreadPoolExecutor(2, r -> {
      Thread t = new Thread(r, "redislock-timer");
      t.setDaemon(true);
      return t;
    });
    scheduler.setRemoveOnCancelPolicy(true);
    StatefulRedisConnection<String, String> conn;
    try {
      conn = sharedClient.connect(StringCodec.UTF8);
    } catch (RuntimeException e) {
      shutdownQuietly();
      throw Protocol.map(e);
    }
    this.shared = conn;
    // One dedicated connection opened now, in the background, so the first
    // wait does not pay for a connection while its caller waits.
    CompletableFuture.runAsync(() -> {
      try {
        giveBack(takeDedicated(false));
      } catch (InterruptedException | RuntimeException e) {
        // The first wait opens its own.
      }
    });
  }

  /** A connection of its own, for one wait or one ephemeral hold. */
  static final class Dedicated {
    final StatefulRedisConnection<String, String> conn;
    /** {@code CLIENT ID}: what {@code CLIENT UNBLOCK} names to wake its wait. */
    final long clientId;
    private volatile boolean closed;
    private volatile Runnable onClose;

    Dedicated(StatefulRedisConnection<String, String> conn, long clientId) {
      this.conn = conn;
      this.clientId = clientId;
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
  Dedicated takeDedicated(boolean interruptible) throws InterruptedException {
    for (Dedicated d; (d = idle.pollFirst()) != null; ) {
      if (d.isOpen()) {
        return d;
      }
      d.conn.closeAsync();
    }
    CompletableFuture<StatefulRedisConnection<String, String>> connecting =
        dedicatedClient.connectAsync(StringCodec.UTF8, uri).toCompletableFuture();
    CompletableFuture<Dedicated> made = connecting.thenCompose(conn -> conn.async().clientId().toCompletableFuture()
        .handle((id, err) -> {
          if (err != null) {
            conn.closeAsync();
            throw new java.util.concurrent.CompletionException(err);
          }
          return new Dedicated(conn, id);
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
    if (d.isOpen() && idle.size() < IDLE_MAX) {
      idle.addFirst(d);
    } else {
      d.conn.closeAsync();
    }
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
    for (Dedicated d; (d = idle.pollFirst()) != null; ) {
      d.conn.close();
    }
    shared.close();
    shutdownQuietly();
  }

  private void shutdownQuietly() {
    scheduler.shutdownNow();
    sharedClient.shutdown(Duration.ZERO, Duration.ofSeconds(2));
    dedicatedClient.shutdown(Duration.ZERO, Duration.ofSeconds(2));
    if (ownResources) {
      resources.shutdown(0, 2, TimeUnit.SECONDS);
    }
  }
}
