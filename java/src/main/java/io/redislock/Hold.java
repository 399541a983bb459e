package io.redislock;

import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * One hold of a lock by one owner token: its fence, its local deadline, its
 * loss signal and its watchdog. Send {@link #fence()} with every write to the
 * resource the lock guards.
 *
 * <p><b>The deadline</b> is the send time (monotonic clock) of the last
 * acquire, reentry or renew the server confirmed, plus the ttl, minus a drift
 * margin of 1% of the ttl + 2 ms: until then the server surely still counts
 * the lease. When it passes without a confirmed renew the hold is lost
 * ({@link LossReason#EXPIRED}), signalled by a timer thread of the client, so
 * never later than the server's lease end whatever the application's threads
 * do. {@code NOTOWNER} (or another type over the key) loses it at once, and an
 * ephemeral hold's own connection closing loses it within milliseconds. A
 * loss is final: nothing later clears it.
 *
 * <p><b>The watchdog</b> (on unless a lease was given explicitly) renews every
 * third of the ttl; a renew that fails in transit is retried until the
 * deadline. Before the last release it is stopped and its renew in flight
 * awaited, so no renew follows a release.
 *
 * <p>Callbacks on {@link #lost()} run on the client's timer or I/O threads: keep
 * them short, or move on with {@code thenRunAsync}.
 */
public final class Hold {
  private final Transport t;
  private final String key;
  private final String owner;
  private final HoldKind kind;
  /** An ephemeral hold's own connection; null otherwise. */
  private final Transport.Dedicated bound;
  private final Backend backend;
  private final CompletableFuture<LossReason> lostSignal = new CompletableFuture<>();

  private final Object mu = new Object();
  private volatile long fence;
  private int count = 1;
  private long ttlMs;
  private boolean autoRenew;
  /** Send time of the last acquire / reentry / renew the server confirmed. */
  private long confirmedSent;
  private long deadline;
  private volatile LossReason lost;
  /** Released to zero by this handle (or given up: release not confirmed). */
  private volatile boolean ended;
  private boolean timersLive;
  private ScheduledFuture<?> deadlineTimer;
  private ScheduledFuture<?> renewTimer;
  private long nextRenew;
  /** The watchdog's renew in flight; completes once its reply is handled. */
  private CompletableFuture<Void> renewInFlight;

  /** Every key's fence, in key order, for a hold on several keys; null otherwise. */
  private volatile List<Long> fences;

  Hold(Transport t, String key, String owner, HoldKind kind, long fence, long ttlMs, long sentNanos,
      boolean autoRenew, Transport.Dedicated bound) {
    this(t, kind.keys() == null ? Backend.single(t, bound) : Backend.keys(t, bound, kind), key, owner, kind,
        fence, ttlMs, sentNanos, autoRenew, bound);
  }

  Hold(Transport t, Backend backend, String key, String owner, HoldKind kind, long fence, long ttlMs,
      long sentNanos, boolean autoRenew, Transport.Dedicated bound) {
    this.backend = backend;
    this.t = t;
    this.key = key;
    this.owner = owner;
    this.kind = kind;
    this.fence = fence;
    this.ttlMs = ttlMs;
    this.autoRenew = autoRenew;
    this.bound = bound;
    synchronized (mu) {
      confirmedSent = sentNanos;
      deadline = deadlineOf(sentNanos, ttlMs);
      timersLive = true;
      t.activities.incrementAndGet();
      armDeadline();
      if (autoRenew) {
        nextRenew = sentNanos + renewPeriodNanos(ttlMs);
        armRenew();
      }
    }
    if (bound != null) {
      // The server ends an ephemeral hold when its connection closes.
      bound.onClose(() -> lose(LossReason.DISCONNECTED));
    }
  }

  // ---------------------------------------------------------------- timing rules

  /** Drift allowed for a lease: 1% of the ttl plus 2 ms, in ns. */
  static long driftNanos(long ttlMs) {
    return ttlMs * 10_000L + 2_000_000L;
  }

  /** Until when a lease of {@code ttlMs} sent at {@code sent} is surely valid (no overflow up to 2^40 ms). */
  static long deadlineOf(long sent, long ttlMs) {
    return sent + Math.max(0, ttlMs * 1_000_000L - driftNanos(ttlMs));
  }

  /** The watchdog renews every third of the lease, so two renews can fail before it ends. */
  static long renewPeriodNanos(long ttlMs) {
    return Math.max(1_000_000L, ttlMs * 1_000_000L / 3);
  }

  /** How soon the watchdog tries again after a renew that failed in transit. */
  static long retryPeriodNanos(long ttlMs) {
    return TimeUnit.MILLISECONDS.toNanos(Math.min(500, Math.max(5, ttlMs / 30)));
  }

  // ---------------------------------------------------------------- accessors

  /** The key (the first, for a hold on several keys). */
  public String key() {
    return key;
  }

  /** The keys held: this hold's key, or every key of a hold on several, in order. */
  public List<String> keys() {
    return kind.keys() != null ? kind.keys() : List.of(key);
  }

  /** One fence per key of {@link #keys()}, in order ({@link #fence()} is the highest). */
  public List<Long> fences() {
    List<Long> f = fences;
    return f != null ? f : List.of(fence);
  }

  void setFences(List<Long> fences) {
    this.fences = List.copyOf(fences);
  }

  /** The owner token this hold is taken under; another process may continue it with {@code resume}. */
  public String owner() {
    return owner;
  }

  /** The fencing token of this hold. */
  public long fence() {
    return fence;
  }

  public HoldKind kind() {
    return kind;
  }

  public boolean isEphemeral() {
    return bound != null;
  }

  /** The server's id of an ephemeral hold's own connection ({@code CLIENT LIST}'s id); -1 otherwise. */
  public long connectionId() {
    return bound != null ? bound.clientId : -1;
  }

  /** The hold count this handle knows (reentries count); 0 once released. */
  public int count() {
    synchronized (mu) {
      return ended ? 0 : count;
    }
  }

  /** Whether this handle still holds the lock: not released, not lost, deadline not passed. */
  public boolean isHeld() {
    return !ended && !isLost();
  }

  /** Whether the hold was lost. Checks the deadline too, so it is right even if a timer is late. */
  public boolean isLost() {
    if (lost == null && !ended) {
      boolean passed;
      synchronized (mu) {
        passed = System.nanoTime() - deadline >= 0;
      }
      if (passed) {
        lose(LossReason.EXPIRED);
      }
    }
    return lost != null;
  }

  /** How the hold was lost; null while it is not. */
  public LossReason lossReason() {
    isLost();
    return lost;
  }

  /** Completes with the reason when the hold is lost; never completes for a hold released cleanly. */
  public CompletionStage<LossReason> lost() {
    return lostSignal.minimalCompletionStage();
  }

  /** ms left before the local deadline (0 once passed or not held). */
  public long remainingMillis() {
    if (!isHeld()) {
      return 0;
    }
    synchronized (mu) {
      return Math.max(0, TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime()));
    }
  }

  /** The current lease length in ms. */
  public long ttlMs() {
    synchronized (mu) {
      return ttlMs;
    }
  }

  // ---------------------------------------------------------------- loss

  /** Raises the loss signal (once): the field first, then the callbacks; stops the timers. */
  void lose(LossReason reason) {
    synchronized (mu) {
      if (lost != null || ended) {
        return;
      }
      lost = reason;
      stopTimers();
    }
    lostSignal.complete(reason);
  }

  private LockException lostError() {
    LossReason r = lost;
    return r == null ? new NotOwnerException() : new LockLostException(r);
  }

  /** Under mu. */
  private void stopTimers() {
    if (deadlineTimer != null) {
      deadlineTimer.cancel(false);
      deadlineTimer = null;
    }
    if (renewTimer != null) {
      renewTimer.cancel(false);
      renewTimer = null;
    }
    if (timersLive) {
      timersLive = false;
      t.activities.decrementAndGet();
    }
  }

  /** Under mu. */
  private void armDeadline() {
    if (deadlineTimer != null) {
      deadlineTimer.cancel(false);
    }
    deadlineTimer = t.schedule(this::deadlineTick, deadline - System.nanoTime());
  }

  private void deadlineTick() {
    synchronized (mu) {
      if (lost != null || ended) {
        return;
      }
      long left = deadline - System.nanoTime();
      if (left > 0) {
        // Moved by a renew, or armed in steps: not yet.
        deadlineTimer = t.schedule(this::deadlineTick, left);
        return;
      }
    }
    lose(LossReason.EXPIRED);
  }

  // ---------------------------------------------------------------- the watchdog

  /** Under mu. */
  private void armRenew() {
    if (renewTimer != null) {
      renewTimer.cancel(false);
    }
    renewTimer = t.schedule(this::renewTick, nextRenew - System.nanoTime());
  }

  private void renewTick() {
    CompletableFuture<Long> f;
    CompletableFuture<Void> done = new CompletableFuture<>();
    long sent;
    long ttl;
    synchronized (mu) {
      renewTimer = null;
      if (!autoRenew || lost != null || ended || renewInFlight != null) {
        return;
      }
      long left = nextRenew - System.nanoTime();
      if (left > 0) {
        renewTimer = t.schedule(this::renewTick, left);
        return;
      }
      // Sent under mu: once stopRenewals() has run, no renew goes out.
      ttl = ttlMs;
      sent = System.nanoTime();
      f = backend.renew(key, owner, ttl);
      renewInFlight = done;
    }
    f.whenComplete((ok, err) -> {
      boolean notOwner = false;
      synchronized (mu) {
        renewInFlight = null;
        if (err == null) {
          confirm(sent, ttl);
          nextRenew = sent + renewPeriodNanos(ttl);
        } else if (Protocol.meansNotOwner(err)) {
          notOwner = true;
        } else {
          // Transport trouble: try again soon; the deadline ends the retries.
          nextRenew = System.nanoTime() + retryPeriodNanos(ttl);
        }
        if (!notOwner && autoRenew && lost == null && !ended) {
          armRenew();
        }
      }
      if (notOwner) {
        lose(LossReason.NOT_OWNER);
      }
      done.complete(null);
    });
  }

  /** A renew (or reentry) sent at {@code sent} with {@code ttl} was confirmed. Under mu. */
  private void confirm(long sent, long ttl) {
    if (lost != null || ended || sent - confirmedSent < 0) {
      // Overlapping renews: the later send wins.
      return;
    }
    confirmedSent = sent;
    ttlMs = ttl;
    deadline = deadlineOf(sent, ttl);
    armDeadline();
  }

  /** Stops the watchdog (no renew is sent after this returns) and waits for its renew in flight. */
  private void stopRenewals() throws InterruptedException {
    CompletableFuture<Void> inflight;
    synchronized (mu) {
      autoRenew = false;
      if (renewTimer != null) {
        renewTimer.cancel(false);
        renewTimer = null;
      }
      inflight = renewInFlight;
    }
    if (inflight != null) {
      try {
        Transport.await(inflight, t.replyTimeoutNanos, true);
      } catch (ExecutionException | TimeoutException e) {
        // A renew that never answers was sent before the release on the same
        // connection: the server runs it first. Go on.
      }
    }
  }

  /**
   * Stops the watchdog without releasing: the hold stays until its lease ends
   * (the loss signal fires at the deadline unless {@link #renew()} is called).
   */
  public void stopWatchdog() throws InterruptedException {
    stopRenewals();
  }

  // ---------------------------------------------------------------- renew, reenter

  /** Renews the lease now, with the same ttl. */
  public void renew() throws InterruptedException {
    renew(ttlMs());
  }

  /**
   * Renews the lease now: it becomes {@code newTtlMs} from now (longer or
   * shorter), and so does the watchdog's period.
   *
   * @throws LockLostException the hold is lost (NOTOWNER: it is lost now)
   */
  public void renew(long newTtlMs) throws InterruptedException {
    if (newTtlMs < 1 || newTtlMs > LockOptions.MAX_MS) {
      throw new RefusedException("ttl must be from 1 to 2^40 ms, not " + newTtlMs);
    }
    checkHeld();
    long sent = System.nanoTime();
    CompletableFuture<Long> f = backend.renew(key, owner, newTtlMs);
    try {
      Transport.await(f, t.replyTimeoutNanos, true);
    } catch (ExecutionException e) {
      if (Protocol.meansNotOwner(e)) {
        lose(LossReason.NOT_OWNER);
        throw lostError();
      }
      throw Protocol.map(e);
    } catch (TimeoutException e) {
      throw new TransportException("no reply to LOCK.RENEW in time", e);
    }
    synchronized (mu) {
      confirm(sent, newTtlMs);
      if (autoRenew && lost == null && !ended) {
        nextRenew = sent + renewPeriodNanos(newTtlMs);
        armRenew();
      }
    }
    if (isLost()) {
      throw lostError();
    }
  }

  /**
   * One more hold by the same owner ({@code LOCK.REENTER} with a new lease):
   * count + 1. Interrupted while the reply is in flight, a reentry that landed
   * is undone on the same connection.
   */
  int reenter(long newTtlMs, boolean interruptible) throws InterruptedException {
    checkHeld();
    long sent = System.nanoTime();
    CompletableFuture<Long> f = backend.reenter(key, owner, newTtlMs);
    long n;
    try {
      n = Transport.await(f, t.replyTimeoutNanos, interruptible);
    } catch (InterruptedException | TimeoutException e) {
      CompletableFuture<Long> undo = f.handle((v, err) -> v).thenCompose(v -> v == null
          ? CompletableFuture.completedFuture(0L)
          : backend.release(key, owner, false));
      t.track(undo);
      Transport.settle(undo, t.replyTimeoutNanos);
      if (e instanceof InterruptedException) {
        throw (InterruptedException) e;
      }
      throw new TransportException("no reply to LOCK.REENTER in time", e);
    } catch (ExecutionException e) {
      if (Protocol.meansNotOwner(e)) {
        lose(LossReason.NOT_OWNER);
        throw lostError();
      }
      throw Protocol.map(e);
    }
    synchronized (mu) {
      count = (int) Math.min(Integer.MAX_VALUE, n);
      confirm(sent, newTtlMs);
      if (autoRenew) {
        nextRenew = sent + renewPeriodNanos(newTtlMs);
        armRenew();
      }
    }
    return (int) n;
  }

  private void checkHeld() {
    if (ended) {
      throw new NotOwnerException();
    }
    if (isLost()) {
      throw lostError();
    }
  }

  // ---------------------------------------------------------------- release

  /**
   * Releases one hold; returns how many are left (0: this owner's hold is
   * gone). Before the last one the watchdog is stopped and awaited.
   *
   * <p>A release that does not complete (interrupted, no reply in time, a
   * transport error) gives the hold up: the handle reports it lost
   * ({@link LossReason#RELEASE_UNCONFIRMED}) and the release is retried in the
   * background until it lands or the lease ends.
   *
   * @throws LockLostException the hold was lost before (or the server said NOTOWNER)
   */
  public int release() throws InterruptedException {
    return release(false);
  }

  /** Releases every hold of this owner at once. */
  public void releaseAll() throws InterruptedException {
    release(true);
  }

  private int release(boolean all) throws InterruptedException {
    boolean last;
    synchronized (mu) {
      if (ended) {
        throw new NotOwnerException();
      }
      last = all || count <= 1;
    }
    if (isLost()) {
      if (lost == LossReason.EXPIRED) {
        // The server may count the lease a little longer than we do: free it now.
        backgroundRelease(CompletableFuture.failedFuture(new TransportException("lost", null)));
      }
      throw lostError();
    }
    try {
      if (last) {
        stopRenewals();
      }
    } catch (InterruptedException e) {
      giveUp(CompletableFuture.failedFuture(e));
      throw e;
    }
    CompletableFuture<Long> f = backend.release(key, owner, all);
    long left;
    try {
      left = Transport.await(f, t.replyTimeoutNanos, true);
    } catch (InterruptedException e) {
      giveUp(f);
      throw e;
    } catch (TimeoutException e) {
      giveUp(f);
      throw lostError();
    } catch (ExecutionException e) {
      if (Protocol.meansNotOwner(e)) {
        lose(LossReason.NOT_OWNER);
        finish();
        throw lostError();
      }
      giveUp(f);
      throw lostError();
    }
    synchronized (mu) {
      count = (int) Math.min(Integer.MAX_VALUE, left);
      if (left > 0) {
        if (last) {
          // Someone else reentered this owner meanwhile: keep the hold as it is.
          autoRenew = false;
        }
        return (int) left;
      }
    }
    finish();
    return 0;
  }

  /** The hold is over by our release: timers stopped, the ephemeral connection closed. */
  private void finish() {
    synchronized (mu) {
      ended = true;
      stopTimers();
    }
    if (bound != null) {
      t.close(bound);
    }
  }

  /** The release did not complete: report the loss, then keep releasing in the background. */
  private void giveUp(CompletableFuture<Long> inflight) {
    lose(LossReason.RELEASE_UNCONFIRMED);
    synchronized (mu) {
      ended = true;
      stopTimers();
    }
    backgroundRelease(inflight);
  }

  /**
   * Once {@code inflight} settles: done if it released everything or the
   * server says NOTOWNER; else {@code RELEASE ALL} again, every retry period,
   * until it lands or the server's lease has surely ended.
   */
  private void backgroundRelease(CompletableFuture<Long> inflight) {
    long leaseEnd;
    long ttl;
    synchronized (mu) {
      ttl = ttlMs;
      leaseEnd = confirmedSent + ttl * 1_000_000L + driftNanos(ttl);
    }
    CompletableFuture<Void> done = new CompletableFuture<>();
    t.track(done);
    retryRelease(inflight, leaseEnd, ttl, done);
  }

  private void retryRelease(CompletableFuture<Long> attempt, long leaseEnd, long ttl, CompletableFuture<Void> done) {
    attempt.whenComplete((left, err) -> {
      boolean landed = (err == null && left != null && left == 0) || (err != null && Protocol.meansNotOwner(err));
      if (landed || System.nanoTime() - leaseEnd >= 0) {
        if (bound != null) {
          t.close(bound);
        }
        done.complete(null);
        return;
      }
      long delay = err == null ? 0 : retryPeriodNanos(ttl);
      t.schedule(() -> {
        CompletableFuture<Long> next;
        try {
          next = backend.release(key, owner, true);
        } catch (RuntimeException e) {
          next = CompletableFuture.failedFuture(e);
        }
        retryRelease(next, leaseEnd, ttl, done);
      }, delay);
    });
  }

  @Override
  public String toString() {
    return "Hold[" + key + " " + owner + " fence=" + fence + " " + kind + (bound != null ? " ephemeral" : "")
        + (lost != null ? " lost=" + lost.wireName() : ended ? " released" : "") + "]";
  }
}
