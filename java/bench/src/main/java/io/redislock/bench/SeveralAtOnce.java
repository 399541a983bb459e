package io.redislock.bench;

import io.lettuce.core.api.sync.RedisCommands;
import io.redislock.DistributedMultiLock;
import io.redislock.DistributedSemaphore;
import io.redislock.Hold;
import io.redislock.LockOptions;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLongArray;
import java.util.function.IntFunction;
import java.util.function.IntUnaryOperator;
import org.redisson.api.RLock;
import org.redisson.api.RPermitExpirableSemaphore;
import org.redisson.api.RSemaphore;
import org.redisson.api.RedissonClient;

/**
 * The several-at-once part of {@code make bench-java}: 32 threads, each
 * request a lock on k of 8 keys drawn at random and named in a random order
 * (this client's {@link DistributedMultiLock}, one {@code LOCK.MACQUIRE …
 * WAIT} per request, against Redisson's {@code RedissonMultiLock}), or 1, 2
 * or 4 of a semaphore's 8 permits as one hold; each holder does one
 * {@code INCR} and releases.
 *
 * <p>Redisson's multi-lock takes its locks one by one and, when one does not
 * come within its share of the wait, gives back the ones it has and starts
 * over; requests that cross can so wait for seconds. So every row is bounded:
 * threads start requests for {@link #WINDOW}, then have {@link #GRACE} to
 * finish the one under way; whoever is still waiting then is interrupted and
 * counted as stalled, and the row goes on to the next.
 */
final class SeveralAtOnce {
  static final int KEYS = 8;
  static final Duration WINDOW = Duration.ofSeconds(3);
  static final Duration GRACE = Duration.ofSeconds(2);
  static final Duration WARMUP = Duration.ofMillis(500);
  static final int SEMAPHORE_PERMITS = 8;
  static final int[] PERMIT_SIZES = {1, 2, 4};
  /** The semaphores' permits end after this unless released (the single-permit table's lease). */
  static final long PERMIT_LEASE_S = 10;

  /** What a request took, and how to give it back. */
  interface Release {
    void release() throws Exception;
  }

  /** One request of thread-local random size/keys; {@code size} is what it asks for (keys or permits). */
  interface Request {
    Release take(int size) throws Exception;
  }

  /** A row's figures; {@code stalled} threads were still waiting at the bound, the oldest for {@code stalledNs}. */
  record Row(double rate, long[] waitsNs, long[] bigWaitsNs, int fewest, int most, double cmds, int stalled,
      long stalledNs) {
    String ms(long[] w, double q) {
      if (w.length == 0) {
        return "-";
      }
      int i = (int) Math.min(w.length - 1, Math.floor(q * w.length));
      return Bench.fmtMs(w[i]);
    }

    String stall() {
      return stalled == 0 ? "none" : stalled + " (waiting " + Bench.fmtMs(stalledNs) + ")";
    }
  }

  final Bench b;
  final RedisCommands<String, String> ctl;
  /**
   * A Redisson client per row: the waiters interrupted at a row's bound leave
   * their client with subscriptions and timers, and the next row starts on a
   * fresh one. They are not shut down: Redisson's shutdown of such a client
   * spins on its timer for minutes, both cores busy. The bench's JVM ends
   * with {@code System.exit}.
   */
  SeveralAtOnce(Bench b) {
    this.b = b;
    this.ctl = b.ctl;
  }

  RedissonClient redisson() {
    return Bench.redisson(b.port);
  }

  /** A row that failed: its error on standard error, a line saying so in the table. */
  static void failed(String name, Exception e, int columns) {
    e.printStackTrace();
    System.out.println("| " + name + " | failed: " + e + " |" + " |".repeat(Math.max(0, columns - 2)));
  }

  /** k distinct keys of {@code prefix}0..7 in a random order. */
  static String[] randomKeys(String prefix, int k) {
    ThreadLocalRandom r = ThreadLocalRandom.current();
    int[] idx = new int[KEYS];
    for (int i = 0; i < KEYS; i++) {
      idx[i] = i;
    }
    // A partial Fisher-Yates shuffle: the first k are a random ordered draw.
    for (int i = 0; i < k; i++) {
      int j = i + r.nextInt(KEYS - i);
      int t = idx[i];
      idx[i] = idx[j];
      idx[j] = t;
    }
    String[] keys = new String[k];
    for (int i = 0; i < k; i++) {
      keys[i] = prefix + idx[i];
    }
    return keys;
  }

  /**
   * {@link Bench#THREADS} threads loop request → {@code INCR} → release for
   * {@code window}, each request of {@code sizeOf} of a random number; bounded as
   * the class comment says. Commands per acquisition leave out the
   * {@code INCR}s and the bench's own {@code INFO}.
   */
  Row run(Request req, IntUnaryOperator sizeOf, int bigSize, String counter, Duration window)
      throws Exception {
    long before = b.calls();
    int n = Bench.THREADS;
    int[] counts = new int[n];
    long[] incrs = new long[n];
    AtomicLongArray waitingSince = new AtomicLongArray(n);
    ConcurrentLinkedQueue<Long> waits = new ConcurrentLinkedQueue<>();
    ConcurrentLinkedQueue<Long> bigWaits = new ConcurrentLinkedQueue<>();
    ConcurrentLinkedQueue<Throwable> errors = new ConcurrentLinkedQueue<>();
    long start = System.nanoTime();
    long stop = start + window.toNanos();
    long bound = stop + GRACE.toNanos();
    // Set at the bound: what ends after it (interrupted, or granted late) is not counted.
    boolean[] over = {false};
    List<Thread> threads = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      int w = i;
      Thread th = new Thread(() -> {
        try {
          while (System.nanoTime() < stop) {
            int size = sizeOf.applyAsInt(ThreadLocalRandom.current().nextInt(1 << 20));
            long t0 = System.nanoTime();
            waitingSince.set(w, t0);
            Release r = req.take(size);
            long waited = System.nanoTime() - t0;
            waitingSince.set(w, 0);
            ctl.incr(counter);
            incrs[w]++;
            r.release();
            synchronized (over) {
              if (over[0]) {
                return;
              }
              waits.add(waited);
              if (size == bigSize) {
                bigWaits.add(waited);
              }
              counts[w]++;
            }
          }
        } catch (Throwable e) {
          synchronized (over) {
            if (!over[0]) {
              errors.add(e);
            }
          }
        }
      }, "several-" + i);
      th.setDaemon(true);
      threads.add(th);
      th.start();
    }
    for (Thread th : threads) {
      long left = bound - System.nanoTime();
      if (left > 0) {
        th.join(Math.max(1, TimeUnit.NANOSECONDS.toMillis(left)));
      }
    }
    long end = System.nanoTime();
    int stalled = 0;
    long stalledNs = 0;
    synchronized (over) {
      over[0] = true;
      for (int i = 0; i < n; i++) {
        long since = waitingSince.get(i);
        if (threads.get(i).isAlive() && since != 0) {
          stalled++;
          stalledNs = Math.max(stalledNs, end - since);
        }
      }
    }
    if (!errors.isEmpty()) {
      throw new IllegalStateException("a request failed", errors.peek());
    }
    for (Thread th : threads) {
      th.interrupt();
    }
    // Waiters that do not answer the interrupt at once are left (daemon threads).
    long joinBy = System.nanoTime() + TimeUnit.SECONDS.toNanos(2);
    for (Thread th : threads) {
      long left = joinBy - System.nanoTime();
      if (left > 0) {
        th.join(Math.max(1, TimeUnit.NANOSECONDS.toMillis(left)));
      }
    }
    long incrTotal = Arrays.stream(incrs).sum();
    double elapsed = (end - start) / 1e9;
    long[] w = waits.stream().mapToLong(Long::longValue).sorted().toArray();
    long[] big = bigWaits.stream().mapToLong(Long::longValue).sorted().toArray();
    double cmds = w.length == 0 ? 0 : (b.calls() - before - incrTotal) / (double) w.length;
    return new Row(w.length / elapsed, w, big, Arrays.stream(counts).min().orElse(0),
        Arrays.stream(counts).max().orElse(0), cmds, stalled, stalledNs);
  }

  /** This client: one lock on every key, {@code LOCK.MACQUIRE … WAIT}; 30 s lease renewed by the watchdog. */
  Request ours(String prefix) {
    return k -> {
      DistributedMultiLock l = b.ours.getMultiLock(randomKeys(prefix, k));
      l.lockInterruptibly();
      return l::unlock;
    };
  }

  /** Redisson's {@code RedissonMultiLock} over one {@code RLock} per key; {@code lock()}: its 30 s watchdog lease. */
  Request redisson(String prefix) {
    RedissonClient redisson = redisson();
    return k -> {
      String[] keys = randomKeys(prefix, k);
      RLock[] locks = new RLock[k];
      for (int i = 0; i < k; i++) {
        locks[i] = redisson.getLock(keys[i]);
      }
      RLock l = redisson.getMultiLock(locks);
      l.lockInterruptibly();
      return l::unlock;
    };
  }

  static int permitSize(int random) {
    return PERMIT_SIZES[random % PERMIT_SIZES.length];
  }

  /** A fresh key prefix (or semaphore name) per run, warm-ups included. */
  int row = 0;

  /**
   * The semaphore table, then the lock table with this client's rows first:
   * Redisson's interrupted multi-lock waiters do not all stop, and the
   * commands they go on sending would weigh on every row after them.
   */
  void print() throws Exception {
    printSemaphores();
    printLocks();
  }

  void printLocks() throws Exception {
    System.out.println();
    System.out.println("| several locks at once, 32 threads, each request k of 8 random keys in a random order "
        + "| k | acquisitions /s | wait p50 | wait p99 | wait max | fewest / most per thread "
        + "| server commands per acquisition | still waiting at the end |");
    System.out.println("|---|---|---|---|---|---|---|---|---|");
    Object[][] libs = {
      {"redislock `getMultiLock(...).lock()` (this)", (IntFunction<Request>) i -> ours("mo" + i + "-")},
      {"Redisson `RedissonMultiLock.lock()`", (IntFunction<Request>) i -> redisson("mr" + i + "-")}};
    for (Object[] lib : libs) {
      for (int k : new int[] {2, 4}) {
        Bench.progress(lib[0] + ", " + k + " of 8 keys");
        @SuppressWarnings("unchecked")
        IntFunction<Request> make = (IntFunction<Request>) lib[1];
        int kk = k;
        // Unmeasured first, on keys of their own (a stalled warm-up leaves its holds there).
        Row s;
        try {
          run(make.apply(row++), r -> kk, -1, "several-ctr", WARMUP);
          s = run(make.apply(row++), r -> kk, -1, "several-ctr", WINDOW);
        } catch (Exception e) {
          failed(lib[0] + " (" + k + " keys)", e, 9);
          continue;
        }
        System.out.printf(Locale.ROOT, "| %s | %d | %,.0f | %s | %s | %s | %d / %d | %.1f | %s |%n", lib[0], k,
            s.rate(), s.ms(s.waitsNs(), 0.5), s.ms(s.waitsNs(), 0.99), s.ms(s.waitsNs(), 1), s.fewest(), s.most(),
            s.cmds(), s.stall());
      }
    }
  }

  void printSemaphores() throws Exception {
    System.out.println();
    System.out.println("| semaphore of 8 permits, 32 threads, each request 1, 2 or 4 permits as one "
        + "(10 s leases) | acquisitions /s | wait p50 | wait p99 | wait max | 4-permit requests: wait p99 / max "
        + "| fewest / most per thread | server commands per acquisition | still waiting at the end |");
    System.out.println("|---|---|---|---|---|---|---|---|---|");
    Object[][] sems = {
      {"redislock `DistributedSemaphore.acquire(k, opts)` (this)", (IntFunction<Request>) i -> {
        DistributedSemaphore sem = b.ours.getSemaphore("msem-ours-" + i, SEMAPHORE_PERMITS);
        LockOptions opts = LockOptions.defaults().ttl(TimeUnit.SECONDS.toMillis(PERMIT_LEASE_S)).watchdog(false)
            .waitForever();
        return k -> {
          Hold h = sem.acquire(k, opts);
          return () -> sem.release(h);
        };
      }},
      {"Redisson `RPermitExpirableSemaphore.acquire(k, 10, SECONDS)`", (IntFunction<Request>) i -> {
        RPermitExpirableSemaphore sem = redisson().getPermitExpirableSemaphore("msem-rpe-" + i);
        sem.trySetPermits(SEMAPHORE_PERMITS);
        return k -> {
          List<String> ids = sem.acquire(k, PERMIT_LEASE_S, TimeUnit.SECONDS);
          return () -> sem.release(ids);
        };
      }},
      {"Redisson `RSemaphore.acquire(k)` (no lease)", (IntFunction<Request>) i -> {
        RSemaphore sem = redisson().getSemaphore("msem-rs-" + i);
        sem.trySetPermits(SEMAPHORE_PERMITS);
        return k -> {
          sem.acquire(k);
          return () -> sem.release(k);
        };
      }}};
    for (Object[] lib : sems) {
      Bench.progress(lib[0] + ", 1/2/4 of 8 permits");
      @SuppressWarnings("unchecked")
      IntFunction<Request> make = (IntFunction<Request>) lib[1];
      Row s;
      try {
        run(make.apply(row++), SeveralAtOnce::permitSize, 4, "several-ctr", WARMUP);
        s = run(make.apply(row++), SeveralAtOnce::permitSize, 4, "several-ctr", WINDOW);
      } catch (Exception e) {
        failed((String) lib[0], e, 9);
        continue;
      }
      System.out.printf(Locale.ROOT, "| %s | %,.0f | %s | %s | %s | %s / %s | %d / %d | %.1f | %s |%n", lib[0],
          s.rate(), s.ms(s.waitsNs(), 0.5), s.ms(s.waitsNs(), 0.99), s.ms(s.waitsNs(), 1),
          s.ms(s.bigWaitsNs(), 0.99), s.ms(s.bigWaitsNs(), 1), s.fewest(), s.most(), s.cmds(), s.stall());
    }
  }
}
