package io.redislock;

import io.lettuce.core.RedisURI;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * One lock held on a majority of several independent servers (Redlock): an
 * odd number, at least 3, each with the module loaded. An acquire asks every
 * server at once and holds the lock when a majority granted it within the
 * lease's validity; then a {@code LOCK.FENCE} round raises each of them to the
 * highest fence returned, so fences rise from holder to holder (any later
 * majority shares a server with this one). Renewals and releases go to every
 * server and count a majority; the hold is lost when no majority can confirm
 * it. A wait retries the round after a short random pause (a server-side
 * wait on one server while holding others could deadlock two clients).
 * Ephemeral holds are refused: no one connection carries the hold.
 */
public final class Redlock implements AutoCloseable {
  private final List<Transport> servers = new ArrayList<>();
  private final int majority;
  private final String id = UUID.randomUUID().toString();

  private Redlock(List<String> urls) {
    if (urls.size() < 3 || urls.size() % 2 == 0) {
      throw new RefusedException("Redlock needs an odd number of servers, at least 3, not " + urls.size());
    }
    try {
      for (String url : urls) {
        servers.add(new Transport(RedisURI.create(url), null, LockClient.DEFAULT_REPLY_TIMEOUT));
      }
    } catch (RuntimeException e) {
      close();
      throw e;
    }
    this.majority = urls.size() / 2 + 1;
  }

  public static Redlock create(List<String> urls) {
    return new Redlock(urls);
  }

  /** The timers and background work of every hold run on the first server's transport. */
  private Transport home() {
    return servers.get(0);
  }

  public int backgroundActivities() {
    int n = 0;
    for (Transport t : servers) {
      n += t.activities.get();
    }
    return n;
  }

  /**
   * Takes the lock on a majority, under a new owner token.
   *
   * @throws WouldBlockException a try found no majority
   * @throws LockTimeoutException no majority within the wait
   * @throws RefusedException an ephemeral hold was asked for
   * @throws InterruptedException interrupted: released everywhere it may have been granted
   */
  public Hold acquire(String key, LockOptions opts) throws InterruptedException {
    LockClient.checkName(key, "key");
    if (opts.isEphemeral()) {
      throw new RefusedException("Redlock cannot keep an ephemeral hold: no one connection carries it");
    }
    if (Thread.interrupted()) {
      throw new InterruptedException();
    }
    String owner = id + ":" + UUID.randomUUID();
    long ttl = opts.ttlMs();
    boolean forever = opts.waitMs() == LockOptions.FOREVER;
    long waitEnd = System.nanoTime() + (opts.waits() && !forever ? opts.waitMs() * 1_000_000L : 0);
    for (;;) {
      long sent = System.nanoTime();
      List<CompletableFuture<Long>> asks = new ArrayList<>();
      for (Transport t : servers) {
        asks.add(Protocol.acquire(t.shared, key, owner, ttl, HoldKind.EXCLUSIVE, false, LockOptions.NO_WAIT, null));
      }
      Long fence = round(asks, key, owner, sent, ttl);
      if (fence != null) {
        return new Hold(home(), new Quorum(), key, owner, HoldKind.EXCLUSIVE, fence, ttl, sent, opts.watchdog(),
            null);
      }
      if (!opts.waits()) {
        throw new WouldBlockException();
      }
      if (!forever && waitEnd - System.nanoTime() <= 0) {
        throw new LockTimeoutException();
      }
      TimeUnit.MILLISECONDS.sleep(ThreadLocalRandom.current().nextLong(5, 50));
    }
  }

  /**
   * One acquire round: the fence when a majority granted within the validity
   * and confirmed the fence round; else null, everything it got released.
   */
  private Long round(List<CompletableFuture<Long>> asks, String key, String owner, long sent, long ttl)
      throws InterruptedException {
    // A server that does not answer within the lease's validity cannot help:
    // count what came by then (a late grant is released when it lands, or
    // renewed and released with the others).
    long validity = Math.min(home().replyTimeoutNanos, Hold.deadlineOf(sent, ttl) - System.nanoTime());
    try {
      Transport.await(CompletableFuture.allOf(settled(asks)), Math.max(0, validity), true);
    } catch (InterruptedException e) {
      releaseEverywhere(asks, key, owner);
      throw e;
    } catch (ExecutionException | TimeoutException e) {
      // Counted below.
    }
    List<Integer> granted = new ArrayList<>();
    long highest = 0;
    for (int i = 0; i < asks.size(); i++) {
      Long f = asks.get(i).isDone() && !asks.get(i).isCompletedExceptionally() ? asks.get(i).join() : null;
      if (f != null) {
        granted.add(i);
        highest = Math.max(highest, f);
      }
    }
    if (granted.size() < majority || Hold.deadlineOf(sent, ttl) - System.nanoTime() <= 0) {
      releaseEverywhere(asks, key, owner);
      return null;
    }
    List<CompletableFuture<Long>> raised = new ArrayList<>();
    for (int i : granted) {
      raised.add(Protocol.send(servers.get(i).shared, Protocol.Cmd.FENCE, key, owner, highest));
    }
    try {
      long left = Math.min(home().replyTimeoutNanos, Hold.deadlineOf(sent, ttl) - System.nanoTime());
      Transport.await(CompletableFuture.allOf(settled(raised)), Math.max(0, left), true);
    } catch (InterruptedException e) {
      releaseEverywhere(asks, key, owner);
      throw e;
    } catch (ExecutionException | TimeoutException e) {
      // Counted below.
    }
    long fence = 0;
    int confirmed = 0;
    for (CompletableFuture<Long> r : raised) {
      if (r.isDone() && !r.isCompletedExceptionally() && r.join() != null) {
        confirmed++;
        fence = Math.max(fence, r.join());
      }
    }
    if (confirmed < majority || Hold.deadlineOf(sent, ttl) - System.nanoTime() <= 0) {
      releaseEverywhere(asks, key, owner);
      return null;
    }
    return fence;
  }

  private static CompletableFuture<?>[] settled(List<CompletableFuture<Long>> fs) {
    return fs.stream().map(f -> f.handle((v, e) -> v)).toArray(CompletableFuture[]::new);
  }

  /**
   * Releases on each server once its acquire's reply is in, on the same
   * connection (a reply still in flight is released after it lands; a
   * server that failed gets the release anyway: NOTOWNER if it holds nothing).
   */
  private void releaseEverywhere(List<CompletableFuture<Long>> asks, String key, String owner) {
    List<CompletableFuture<Long>> releases = new ArrayList<>();
    for (int i = 0; i < asks.size(); i++) {
      Transport t = servers.get(i);
      releases.add(asks.get(i).handle((v, e) -> v != null || e != null)
          .thenCompose(send -> send ? Protocol.send(t.shared, Protocol.Cmd.RELEASE, key, owner).handle((x, e) -> x)
              : CompletableFuture.completedFuture(null)));
    }
    CompletableFuture<Void> all = CompletableFuture.allOf(settled(releases));
    home().track(all);
    Transport.settle(all, home().replyTimeoutNanos);
  }

  /** Renew, reenter, release on every server; a majority decides. */
  private final class Quorum implements Backend {
    private CompletableFuture<Long> everywhere(Protocol.Cmd cmd, Object... args) {
      List<CompletableFuture<Long>> replies = new ArrayList<>();
      for (Transport t : servers) {
        CompletableFuture<Long> r;
        try {
          r = Protocol.send(t.shared, cmd, args);
        } catch (RuntimeException e) {
          r = CompletableFuture.failedFuture(e);
        }
        replies.add(r);
      }
      return CompletableFuture.allOf(settled(replies)).thenApply(x -> {
        int ok = 0;
        int notOwner = 0;
        long value = 0;
        for (CompletableFuture<Long> r : replies) {
          if (!r.isCompletedExceptionally()) {
            ok++;
            value = Math.max(value, r.join() == null ? 0 : r.join());
          } else {
            try {
              r.join();
            } catch (RuntimeException e) {
              if (Protocol.meansNotOwner(e)) {
                notOwner++;
              }
            }
          }
        }
        if (ok >= majority) {
          return value;
        }
        if (servers.size() - notOwner < majority) {
          throw new NotOwnerException();
        }
        throw new TransportException("no Redlock majority: " + ok + " of " + servers.size() + " answered", null);
      });
    }

    @Override
    public CompletableFuture<Long> renew(String key, String owner, long ttlMs) {
      return everywhere(Protocol.Cmd.RENEW, key, owner, ttlMs);
    }

    @Override
    public CompletableFuture<Long> reenter(String key, String owner, long ttlMs) {
      return everywhere(Protocol.Cmd.REENTER, key, owner, ttlMs);
    }

    @Override
    public CompletableFuture<Long> release(String key, String owner, boolean all) {
      return all ? everywhere(Protocol.Cmd.RELEASE, key, owner, "ALL") : everywhere(Protocol.Cmd.RELEASE, key, owner);
    }
  }

  @Override
  public void close() {
    for (Transport t : servers) {
      try {
        t.close();
      } catch (RuntimeException e) {
        // Closing the others matters more.
      }
    }
  }
}
