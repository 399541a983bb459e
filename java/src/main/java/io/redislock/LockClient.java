package io.redislock;

import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.RedisURI;
import io.lettuce.core.resource.ClientResources;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeoutException;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The entry point: a connection to one server (or to the master a Sentinel
 * names) that takes holds, and hands out the {@code java.util.concurrent}
 * shaped objects built on them.
 *
 * <pre>{@code
 * try (LockClient client = LockClient.create("redis://127.0.0.1:6379")) {
 *   DistributedLock lock = client.getLock("order:42");
 *   lock.lock();
 *   try { write(lock.getFence()); } finally { lock.unlock(); }
 * }
 * }</pre>
 *
 * <p>Thread-safe; one per application is enough. Waits and ephemeral holds
 * run on dedicated connections, never on the shared one.
 */
public final class LockClient implements AutoCloseable {
  /** How long a command other than a wait may take: past it, it counts as failed. */
  public static final Duration DEFAULT_REPLY_TIMEOUT = Duration.ofSeconds(10);

  final Transport t;
  /** This client's random 128-bit part of every owner token. */
  final String id = UUID.randomUUID().toString();
  private final ConcurrentHashMap<String, ThreadOwners> owners = new ConcurrentHashMap<>();

  private LockClient(Transport t) {
    this.t = t;
  }

  /**
   * Connects to {@code url}: {@code redis://host:port[/db]} for one server,
   * {@code redis-sentinel://host:port[,host:port]#master} for the master a
   * Sentinel names (Lettuce's URI syntax).
   */
  public static LockClient create(String url) {
    return create(RedisURI.create(url));
  }

  public static LockClient create(RedisURI uri) {
    return create(uri, null, DEFAULT_REPLY_TIMEOUT);
  }

  /** With the application's Lettuce resources (event loops) and reply timeout. */
  public static LockClient create(RedisURI uri, ClientResources resources, Duration replyTimeout) {
    return new LockClient(new Transport(uri, resources, replyTimeout, false));
  }

  /**
   * Connects to a Redis Cluster through {@code url}, any of its nodes
   * ({@code redis://host:port}): each command goes to the node of its key's
   * slot, and a wait or an ephemeral hold runs on a connection of its own to
   * that node, following {@code MOVED} and {@code ASK}.
   */
  public static LockClient createCluster(String url) {
    return createCluster(RedisURI.create(url), null, DEFAULT_REPLY_TIMEOUT);
  }

  public static LockClient createCluster(RedisURI uri, ClientResources resources, Duration replyTimeout) {
    return new LockClient(new Transport(uri, resources, replyTimeout, true));
  }

  /**
   * A reentrant, per-thread {@link java.util.concurrent.locks.Lock} on key
   * {@code name}. Every handle of one name from this client shares the
   * per-thread owners, as Redisson's: {@code getLock("a").lock()} then
   * {@code getLock("a").unlock()} on the same thread works.
   */
  public DistributedLock getLock(String name) {
    return getLock(name, id);
  }

  /**
   * As {@link #getLock(String)}, in an owner scope of its own: handles of
   * different scopes are different owners even on one thread.
   */
  public DistributedLock getLock(String name, String scope) {
    return new DistributedLock(owners(name, scope));
  }

  /** A read-write lock on key {@code name}: both sides share one owner per thread. */
  public DistributedReadWriteLock getReadWriteLock(String name) {
    return getReadWriteLock(name, id);
  }

  public DistributedReadWriteLock getReadWriteLock(String name, String scope) {
    return new DistributedReadWriteLock(owners(name, scope));
  }

  private ThreadOwners owners(String name, String scope) {
    checkName(name, "name");
    checkName(scope, "scope");
    return owners.computeIfAbsent(scope + "\n" + name, k -> new ThreadOwners(this, name, scope));
  }

  /**
   * Takes every one of {@code keys} at once, all or none, under a new owner
   * token: a try, or a wait ({@code opts.waitMs}) queued on every key as one
   * request and granted when all can be granted in the same step, never some
   * while it waits. So holds on the same keys asked in any order never
   * deadlock, and no later request takes any of its keys first. The hold
   * ({@link Hold#keys()}, {@link Hold#fences()}) has one watchdog that renews
   * every key with one {@code LOCK.MRENEW}; losing any key loses it; a
   * release gives every key back. An interrupt leaves nothing held.
   */
  public Hold acquireAll(List<String> keys, LockOptions opts) throws InterruptedException {
    HoldKind kind = HoldKind.keys(keys);
    return acquire(kind.keys().get(0), newOwner(), kind, opts, true);
  }

  /** A {@link java.util.concurrent.locks.Lock} on every one of {@code names} at once, per thread. */
  public DistributedMultiLock getMultiLock(String... names) {
    return new DistributedMultiLock(this, HoldKind.keys(List.of(names)));
  }

  /** A semaphore of {@code permits} leased permits on key {@code name}; each permit has its own fence. */
  public DistributedSemaphore getSemaphore(String name, int permits) {
    return new DistributedSemaphore(this, name, HoldKind.permit(permits));
  }

  /** A new owner token, unique to one hold. */
  public String newOwner() {
    return id + ":" + UUID.randomUUID();
  }

  /** Takes an exclusive hold under a new owner token. */
  public Hold acquire(String key, LockOptions opts) throws InterruptedException {
    return acquire(key, newOwner(), HoldKind.EXCLUSIVE, opts);
  }

  /**
   * Takes a hold of {@code kind} on {@code key} as {@code owner}: a try, or a
   * wait on a dedicated connection ({@code opts.waitMs}).
   *
   * @throws WouldBlockException a try found it held
   * @throws LockTimeoutException the wait ran out
   * @throws InterruptedException interrupted: nothing is held (a grant that
   *     crossed the interrupt was released on the connection that asked)
   */
  public Hold acquire(String key, String owner, HoldKind kind, LockOptions opts) throws InterruptedException {
    return acquire(key, owner, kind, opts, true);
  }

  Hold acquire(String key, String owner, HoldKind kind, LockOptions opts, boolean interruptible)
      throws InterruptedException {
    checkName(key, "key");
    checkName(owner, "owner");
    if (interruptible && Thread.interrupted()) {
      throw new InterruptedException();
    }
    if (!opts.isEphemeral() && (!opts.waits() || kind.limit() == 0)) {
      // A free lock nobody waits for is granted at once on the shared
      // connection; a busy one answers nil (the server lets nobody in ahead
      // of its waiters), and a wait then queues on a dedicated connection.
      // A semaphore's permit waits there at once: a semaphore is usually
      // full when asked (that is what it is for), and the try would cost
      // each of those waits a round trip.
      Hold h = grantOnShared(key, owner, kind, opts, interruptible);
      if (h != null) {
        return h;
      }
      if (!opts.waits()) {
        throw notObtained(key);
      }
    }
    return onDedicated(key, owner, kind, opts, interruptible);
  }

  /**
   * The async form of {@link #acquire(String, String, HoldKind, LockOptions)},
   * keyed by the owner token the caller gives rather than by a thread: the
   * call runs on a thread of its own and the future completes with the hold.
   * {@code cancel(true)} on the future (or {@code cancel(false)}: both
   * interrupt) cancels the call at whatever point it is, with the same
   * guarantee as an interrupt: nothing held. A hold granted as the cancel
   * came is released.
   */
  public CompletableFuture<Hold> acquireAsync(String key, String owner, HoldKind kind, LockOptions opts) {
    AsyncCall call = new AsyncCall();
    Thread worker = new Thread(() -> {
      try {
        Hold h = acquire(key, owner, kind, opts, true);
        if (!call.complete(h)) {
          // Cancelled as the grant came: nobody will release it but us.
          try {
            h.releaseAll();
          } catch (InterruptedException | LockException e) {
            // Lost already, or its release goes on in the background.
          }
        }
      } catch (InterruptedException e) {
        call.cancel(false);
      } catch (Throwable e) {
        call.completeExceptionally(e);
      } finally {
        t.activities.decrementAndGet();
      }
    }, "redislock-acquire");
    worker.setDaemon(true);
    call.worker = worker;
    t.activities.incrementAndGet();
    worker.start();
    return call;
  }

  /** A future whose cancel interrupts the thread running the call. */
  private static final class AsyncCall extends CompletableFuture<Hold> {
    volatile Thread worker;

    @Override
    public boolean cancel(boolean mayInterruptIfRunning) {
      boolean cancelled = super.cancel(mayInterruptIfRunning);
      Thread w = worker;
      if (cancelled && w != null && w != Thread.currentThread()) {
        w.interrupt();
      }
      return cancelled;
    }
  }

  /**
   * Continues a hold another process took, by its owner token: a renew
   * confirms it and starts the deadline ({@code NOTOWNER}: not held).
   * {@code fence} null asks the server for it.
   */
  public Hold resume(String key, String owner, long ttlMs, Long fence, boolean watchdog) throws InterruptedException {
    checkName(key, "key");
    checkName(owner, "owner");
    LockOptions.defaults().ttl(ttlMs);
    long sent = System.nanoTime();
    CompletableFuture<Long> renew = Protocol.send(t.shared, Protocol.Cmd.RENEW, key, owner, ttlMs);
    CompletableFuture<Long> fenceReply = fence != null ? CompletableFuture.completedFuture(fence)
        // LOCK.FENCE with 1 changes nothing and answers the hold's fence.
        : Protocol.send(t.shared, Protocol.Cmd.FENCE, key, owner, 1);
    long f;
    try {
      Transport.await(renew, t.replyTimeoutNanos, true);
      f = Transport.await(fenceReply, t.replyTimeoutNanos, true);
    } catch (ExecutionException e) {
      throw Protocol.map(e);
    } catch (TimeoutException e) {
      throw new TransportException("no reply in time", e);
    }
    return new Hold(t, key, owner, HoldKind.EXCLUSIVE, f, ttlMs, sent, watchdog,
        null);
  }

  /** Background activities still alive: watchdogs and deadline timers of holds, background releases, clean-ups. */
  public int backgroundActivities() {
    return t.activities.get();
  }

  @Override
  public void close() {
    t.close();
  }

  // ------------------------------------------------------------------ acquire paths

  /** One attempt on the shared connection: the hold, or null if the server answered nil. */
  private Hold grantOnShared(String key, String owner, HoldKind kind, LockOptions opts, boolean interruptible)
      throws InterruptedException {
    long sent = System.nanoTime();
    List<Long> fences = new ArrayList<>();
    CompletableFuture<Long> f =
        Protocol.acquire(t.shared, key, owner, opts.ttlMs(), kind, false, LockOptions.NO_WAIT, fences);
    Long fence;
    try {
      fence = Transport.await(f, t.replyTimeoutNanos, interruptible);
    } catch (InterruptedException | TimeoutException e) {
      // The reply may carry a grant: release it on the same connection once it lands.
      CompletableFuture<Long> undo = f.handle((v, err) -> v).thenCompose(v -> v == null
          ? CompletableFuture.completedFuture(0L)
          : Protocol.release(t.shared, key, owner, kind, false));
      t.track(undo);
      Transport.settle(undo, t.replyTimeoutNanos);
      if (e instanceof InterruptedException) {
        throw (InterruptedException) e;
      }
      throw new TransportException("no reply to LOCK.ACQUIRE in time: nothing is held", e);
    } catch (ExecutionException e) {
      throw Protocol.map(e);
    }
    if (fence == null) {
      return null;
    }
    Hold h = new Hold(t, key, owner, kind, fence, opts.ttlMs(), sent, opts.watchdog(), null);
    h.setFences(fences);
    return h;
  }

  /**
   * A wait, or an ephemeral hold, on a dedicated connection. A wait longer
   * than a third of the ttl is confirmed with a renew on the same connection;
   * a renew that finds the lock gone ({@code NOTOWNER}: the grant was taken
   * away before we could use it) is not a hold, and the call waits again
   * within what is left of its wait.
   */
  private Hold onDedicated(String key, String owner, HoldKind kind, LockOptions opts, boolean interruptible)
      throws InterruptedException {
    // How long the call has waited counts from its start: the connection it
    // may have to open first is part of the wait.
    long callStart = System.nanoTime();
    Transport.Dedicated d = t.takeDedicated(key, interruptible);
    int redirects = 0;
    boolean asking = false;
    boolean waits = opts.waits();
    boolean forever = opts.waitMs() == LockOptions.FOREVER;
    long ttl = opts.ttlMs();
    long waitEnd = System.nanoTime() + (waits && !forever ? opts.waitMs() * 1_000_000L : 0);
    for (;;) {
      long waitMs = !waits ? LockOptions.NO_WAIT
          : forever ? LockOptions.FOREVER : Math.max(1, (waitEnd - System.nanoTime()) / 1_000_000L);
      long sent = System.nanoTime();
      if (asking) {
        // ASK: the slot is moving; this one command goes to the importing node.
        d.commands().asking();
        asking = false;
      }
      List<Long> fences = new ArrayList<>();
      CompletableFuture<Long> f =
          Protocol.acquire(d.commands(), key, owner, ttl, kind, opts.isEphemeral(), waitMs, fences);
      Long fence;
      try {
        long limit = !waits ? t.replyTimeoutNanos : forever ? -1 : waitMs * 1_000_000L + t.replyTimeoutNanos;
        fence = Transport.await(f, limit, interruptible);
      } catch (InterruptedException | TimeoutException e) {
        abandon(d, f, key, owner, kind);
        if (e instanceof InterruptedException) {
          throw (InterruptedException) e;
        }
        throw new TransportException("no reply to LOCK.ACQUIRE in time: nothing is held", e);
      } catch (ExecutionException e) {
        Redirect r = Redirect.of(e);
        if (r != null && t.isCluster() && redirects++ < MAX_REDIRECTS) {
          // Refused before it ran: nothing was granted here. Go where the reply says.
          t.giveBack(d);
          if (!r.ask) {
            t.refreshTopology();
          }
          d = t.takeDedicated(t.node(r.host, r.port), interruptible);
          asking = r.ask;
          continue;
        }
        LockException mapped = Protocol.map(e);
        if (mapped instanceof TransportException) {
          // The connection failed under the command: a grant may have been made
          // that no reply will tell us about.
          abandon(d, f, key, owner, kind);
        } else {
          t.giveBack(d);
        }
        throw mapped;
      }
      if (fence == null) {
        t.giveBack(d);
        if (waits) {
          throw new LockTimeoutException();
        }
        throw notObtained(key);
      }
      long waitedFrom = Math.min(callStart, sent);
      callStart = Long.MAX_VALUE;
      if (waits && System.nanoTime() - waitedFrom > ttl * 1_000_000L / 3) {
        // The lease began at the hand-off, somewhere in the wait: confirm it
        // with a renew and count the deadline from the renew's send.
        long renewSent = System.nanoTime();
        CompletableFuture<Long> r = Protocol.renew(d.commands(), key, owner, ttl, kind);
        try {
          Transport.await(r, t.replyTimeoutNanos, interruptible);
        } catch (InterruptedException | TimeoutException e) {
          abandon(d, r, key, owner, kind);
          if (e instanceof InterruptedException) {
            throw (InterruptedException) e;
          }
          throw new TransportException("no reply to LOCK.RENEW in time: nothing is held", e);
        } catch (ExecutionException e) {
          if (Protocol.meansNotOwner(e)) {
            if (forever || waitEnd - System.nanoTime() > 0) {
              continue;
            }
            t.giveBack(d);
            throw new LockTimeoutException();
          }
          abandon(d, r, key, owner, kind);
          throw Protocol.map(e);
        }
        sent = renewSent;
      }
      Hold h = new Hold(t, key, owner, kind, fence, ttl, sent, opts.watchdog(), opts.isEphemeral() ? d : null);
      h.setFences(fences);
      if (!opts.isEphemeral()) {
        t.giveBack(d);
      }
      return h;
    }
  }

  /**
   * A command on a dedicated connection was given up (interrupt, no reply in
   * time, a failed connection) and may have been granted, or may still be:
   * parked in the queue, held up by a pause, or its reply in flight. If its
   * reply is already here, a grant is released on the same connection.
   * Otherwise the server drops that connection ({@code CLIENT KILL ID}, which
   * ends a parked wait and a command held up by a pause), and only then, on
   * the shared connection, after the kill, the owner's release: no grant can
   * come after the kill, and one that came before is released. (A
   * {@code CLIENT UNBLOCK} is not enough: Redis 7.0 answers a command held
   * up by {@code CLIENT PAUSE} with the error and then runs it all the same
   * when the pause ends.) Waits up to the reply timeout for the clean-up;
   * past it, it ends in the background.
   */
  private void abandon(Transport.Dedicated d, CompletableFuture<Long> f, String key, String owner, HoldKind kind) {
    CompletableFuture<?> done;
    if (f.isDone() && !f.isCompletedExceptionally()) {
      Long v = f.join();
      if (v == null) {
        t.giveBack(d);
        return;
      }
      done = Protocol.release(d.commands(), key, owner, kind, false).handle((x, e) -> {
        if (e == null) {
          t.giveBack(d);
        } else {
          t.close(d);
        }
        return null;
      });
    } else {
      done = t.kill(d).handle((x, e) -> null)
          .thenCompose(x -> Protocol.release(t.shared, key, owner, kind, false).handle((y, e) -> null));
      t.close(d);
    }
    t.track(done);
    Transport.settle(done, t.replyTimeoutNanos);
  }

  private static final Pattern QUARANTINE = Pattern.compile("quarantine_ms:(\\d+)");

  /**
   * A try answered nil: held by someone else, or the server is in its
   * quarantine (it begins no hold, even on a free lock). {@code INFO lock}
   * tells them apart; asked only on this failure path.
   */
  private LockException notObtained(String key) {
    try {
      String info = Transport.await(t.info(key, "lock"), t.replyTimeoutNanos, false);
      Matcher m = QUARANTINE.matcher(info == null ? "" : info);
      if (m.find() && Long.parseLong(m.group(1)) > 0) {
        return new QuarantineException();
      }
    } catch (ExecutionException | TimeoutException | InterruptedException | RuntimeException e) {
      // Cannot tell: the common answer.
    }
    return new WouldBlockException();
  }

  /** Redirects a wait follows before it gives up: a cluster's slots move rarely. */
  private static final int MAX_REDIRECTS = 5;

  /** A {@code MOVED slot host:port} or {@code ASK slot host:port} reply. */
  static final class Redirect {
    private static final Pattern REPLY = Pattern.compile("^(MOVED|ASK) \\d+ (\\S+):(\\d+)");
    final boolean ask;
    final String host;
    final int port;

    private Redirect(boolean ask, String host, int port) {
      this.ask = ask;
      this.host = host;
      this.port = port;
    }

    /** The redirect {@code err} is, or null. */
    static Redirect of(Throwable err) {
      Throwable e = Protocol.unwrap(err);
      if (!(e instanceof RedisCommandExecutionException) || e.getMessage() == null) {
        return null;
      }
      Matcher m = REPLY.matcher(e.getMessage());
      if (!m.find()) {
        return null;
      }
      return new Redirect(m.group(1).equals("ASK"), m.group(2), Integer.parseInt(m.group(3)));
    }
  }

  static void checkName(String s, String what) {
    if (s == null || s.isEmpty() || s.length() > 1024) {
      throw new RefusedException(what + " must be 1 to 1024 characters long");
    }
  }
}
