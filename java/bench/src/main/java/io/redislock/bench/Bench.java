package io.redislock.bench;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.api.sync.RedisCommands;
import io.redislock.DistributedReadWriteLock;
import io.redislock.DistributedSemaphore;
import io.redislock.Hold;
import io.redislock.LockClient;
import io.redislock.LockOptions;
import io.redislock.shedlock.ModuleLockProvider;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Lock;
import java.util.function.Function;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.LockProvider;
import net.javacrumbs.shedlock.core.SimpleLock;
import org.redisson.Redisson;
import org.redisson.api.RPermitExpirableSemaphore;
import org.redisson.api.RReadWriteLock;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;
import org.springframework.data.redis.connection.RedisStandaloneConfiguration;
import org.springframework.data.redis.connection.lettuce.LettuceConnectionFactory;
import org.springframework.integration.redis.util.RedisLockRegistry;

/**
 * {@code make bench-java}: this client beside Redisson (RLock, RFairLock,
 * RFencedLock, RReadWriteLock, RPermitExpirableSemaphore), Spring
 * Integration's RedisLockRegistry (spin and pub/sub) and ShedLock's Redis
 * provider, and several keys or permits at once against Redisson's
 * multi-lock and semaphores ({@link SeveralAtOnce}; {@code Bench several}
 * runs that part alone), on one server with the module loaded ({@code LOCK_SERVER},
 * default redis-server; {@code LOCK_MODULE}). Markdown tables on standard
 * output, progress on standard error.
 *
 * <p>{@code Bench hold <port>} is the child JVM of the takeover run: it takes
 * one lock per library, says so, and waits to be killed.
 */
public final class Bench {
  static final int THREADS = 32;
  static final Duration UNCONTENDED_RUN = Duration.ofMillis(1500);
  static final Duration CONTENDED_RUN = Duration.ofSeconds(2);
  static final Duration WARMUP = Duration.ofMillis(500);
  /** Every library's lease where one is given: Redisson's watchdog lease. */
  static final Duration LEASE = Duration.ofSeconds(30);
  /** ShedLock never waits: its callers try again after this pause. */
  static final long SHEDLOCK_RETRY_MS = 1;

  /** Releases what {@link Taker#take} took. */
  interface Release {
    void release() throws Exception;
  }

  /** Takes the lock (waiting as the library waits), on one thread. */
  interface Taker {
    Release take() throws Exception;
  }

  /** A library under test: a taker per thread on a key. */
  record Lib(String name, Function<String, Taker> perThread) {}

  final int port;
  final RedisCommands<String, String> ctl;
  final LockClient ours;
  final RedissonClient redisson;
  final LettuceConnectionFactory spring;
  final LockProvider shedlock;
  final LockProvider oursShedlock;
  final ConcurrentLinkedQueue<RedisLockRegistry> made = new ConcurrentLinkedQueue<>();

  Bench(int port, RedisCommands<String, String> ctl) {
    this.port = port;
    this.ctl = ctl;
    this.ours = LockClient.create("redis://127.0.0.1:" + port);
    this.redisson = redisson(port);
    this.spring = springFactory(port);
    this.shedlock = new net.javacrumbs.shedlock.provider.redis.spring.RedisLockProvider(spring);
    this.oursShedlock = new ModuleLockProvider(ours);
  }

  static RedissonClient redisson(int port) {
    Config cfg = new Config();
    cfg.useSingleServer().setAddress("redis://127.0.0.1:" + port);
    return Redisson.create(cfg);
  }

  static LettuceConnectionFactory springFactory(int port) {
    LettuceConnectionFactory f = new LettuceConnectionFactory(new RedisStandaloneConfiguration("127.0.0.1", port));
    f.afterPropertiesSet();
    f.start();
    return f;
  }

  /** A registry as a Spring application makes one, its lease {@link #LEASE}. */
  RedisLockRegistry registry(RedisLockRegistry.RedisLockType type) {
    RedisLockRegistry r = new RedisLockRegistry(spring, "bench", LEASE);
    r.setRedisLockType(type);
    made.add(r);
    return r;
  }

  static Taker lockTaker(Lock l) {
    return () -> {
      l.lock();
      return l::unlock;
    };
  }

  static Taker shedTaker(LockProvider p, String key) {
    return () -> {
      while (true) {
        Optional<SimpleLock> l = p.lock(new LockConfiguration(Instant.now(), key, LEASE, Duration.ZERO));
        if (l.isPresent()) {
          return l.get()::unlock;
        }
        Thread.sleep(SHEDLOCK_RETRY_MS);
      }
    };
  }

  List<Lib> mutexes() {
    return List.of(
        new Lib("redislock `DistributedLock` (this)", key -> lockTaker(ours.getLock(key))),
        new Lib("Redisson `RLock`", key -> lockTaker(redisson.getLock(key))),
        new Lib("Redisson `RFairLock`", key -> lockTaker(redisson.getFairLock(key))),
        new Lib("Redisson `RFencedLock`", key -> lockTaker(redisson.getFencedLock(key))),
        // One registry per thread: each thread stands for an application instance
        // (inside one registry a local ReentrantLock queues the threads first).
        new Lib("Spring `RedisLockRegistry` spin",
            key -> lockTaker(registry(RedisLockRegistry.RedisLockType.SPIN_LOCK).obtain(key))),
        new Lib("Spring `RedisLockRegistry` pub/sub",
            key -> lockTaker(registry(RedisLockRegistry.RedisLockType.PUB_SUB_LOCK).obtain(key))),
        new Lib("redislock `ModuleLockProvider` (ShedLock, retry 1 ms)", key -> shedTaker(oursShedlock, key)),
        new Lib("ShedLock `RedisLockProvider` (retry 1 ms)", key -> shedTaker(shedlock, key)));
  }

  // ---- measurements ----

  double uncontended(Lib lib, String key) throws Exception {
    Taker t = lib.perThread().apply(key);
    for (int i = 0; i < 500; i++) {
      t.take().release();
    }
    long n = 0;
    long start = System.nanoTime();
    long end = start + UNCONTENDED_RUN.toNanos();
    long now;
    do {
      t.take().release();
      n++;
      now = System.nanoTime();
    } while (now < end);
    return n / ((now - start) / 1e9);
  }

  record Stats(double rate, long[] waitsNs, int fewest, int most, double cmds) {
    String ms(double q) {
      if (waitsNs.length == 0) {
        return "-";
      }
      int i = (int) Math.min(waitsNs.length - 1, Math.floor(q * waitsNs.length));
      return fmtMs(waitsNs[i]);
    }
  }

  static String fmtMs(long ns) {
    double ms = ns / 1e6;
    return ms >= 100 ? String.format(Locale.ROOT, "%,.0f ms", ms) : String.format(Locale.ROOT, "%.2f ms", ms);
  }

  /**
   * {@code THREADS} threads loop take → release on one key for
   * {@link #CONTENDED_RUN}; {@code takers[i]} is thread i's taker and
   * {@code kinds}, when not null, sorts the waits into the rows of a mix.
   */
  Stats contended(Taker[] takers) throws Exception {
    return contended(takers, CONTENDED_RUN);
  }

  Stats contended(Taker[] takers, Duration run) throws Exception {
    long before = calls();
    int[] counts = new int[takers.length];
    ConcurrentLinkedQueue<Long> waits = new ConcurrentLinkedQueue<>();
    long start = System.nanoTime();
    long stop = start + run.toNanos();
    List<CompletableFuture<Void>> done = new ArrayList<>();
    for (int i = 0; i < takers.length; i++) {
      int w = i;
      CompletableFuture<Void> f = new CompletableFuture<>();
      done.add(f);
      Thread th = new Thread(() -> {
        try {
          while (System.nanoTime() < stop) {
            long t0 = System.nanoTime();
            Release r = takers[w].take();
            waits.add(System.nanoTime() - t0);
            r.release();
            counts[w]++;
          }
          f.complete(null);
        } catch (Throwable e) {
          f.completeExceptionally(e);
        }
      }, "bench-" + i);
      th.setDaemon(true);
      th.start();
    }
    CompletableFuture.allOf(done.toArray(new CompletableFuture<?>[0])).get(2, TimeUnit.MINUTES);
    double elapsed = (System.nanoTime() - start) / 1e9;
    long[] w = waits.stream().mapToLong(Long::longValue).sorted().toArray();
    int fewest = Arrays.stream(counts).min().orElse(0);
    int most = Arrays.stream(counts).max().orElse(0);
    return new Stats(w.length / elapsed, w, fewest, most, w.length == 0 ? 0 : (calls() - before) / (double) w.length);
  }

  Stats contended(Lib lib, String key, Duration run) throws Exception {
    Taker[] takers = new Taker[THREADS];
    for (int i = 0; i < THREADS; i++) {
      takers[i] = lib.perThread().apply(key);
    }
    return contended(takers, run);
  }

  /** A take of the read side with probability {@code readShare}, else of the write side. */
  static Taker mix(Lock read, Lock write, double readShare) {
    return () -> {
      Lock l = ThreadLocalRandom.current().nextDouble() < readShare ? read : write;
      l.lock();
      return l::unlock;
    };
  }

  /** Server commands so far, but this bench's own INFO calls. */
  long calls() {
    long total = 0;
    for (String line : ctl.info("commandstats").split("\n")) {
      int i = line.indexOf("calls=");
      if (i >= 0 && !line.startsWith("cmdstat_info")) {
        total += Long.parseLong(line.substring(i + 6, line.indexOf(',', i)));
      }
    }
    return total;
  }

  // ---- the takeover after a killed holder JVM ----

  static final String[] TAKEOVER = {
    "redislock, ephemeral hold (this)", "redislock, 30 s lease + watchdog (this)", "Redisson `RLock`, watchdog (30 s)",
    "Spring `RedisLockRegistry` spin, 30 s", "Spring `RedisLockRegistry` pub/sub, 30 s",
    "ShedLock `RedisLockProvider`, lockAtMostFor 30 s (retry 1 ms)"};

  /** The child JVM: takes {@code TAKEOVER}'s locks on keys t0..t5, prints "held", waits for its kill. */
  static void hold(int port) throws Exception {
    LockClient c = LockClient.create("redis://127.0.0.1:" + port);
    c.acquire("t0", LockOptions.defaults().ephemeral(true));
    c.getLock("t1").lock();
    redisson(port).getLock("t2").lock();
    LettuceConnectionFactory f = springFactory(port);
    RedisLockRegistry spin = new RedisLockRegistry(f, "bench", LEASE);
    spin.obtain("t3").lock();
    RedisLockRegistry pubsub = new RedisLockRegistry(f, "bench", LEASE);
    pubsub.setRedisLockType(RedisLockRegistry.RedisLockType.PUB_SUB_LOCK);
    pubsub.obtain("t4").lock();
    new net.javacrumbs.shedlock.provider.redis.spring.RedisLockProvider(f)
        .lock(new LockConfiguration(Instant.now(), "t5", LEASE, Duration.ZERO)).orElseThrow();
    System.out.println("held");
    System.out.flush();
    Thread.sleep(Long.MAX_VALUE);
  }

  String[] takeover() throws Exception {
    ProcessBuilder pb = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
        "-cp", System.getProperty("java.class.path"), Bench.class.getName(), "hold", String.valueOf(port));
    pb.redirectError(ProcessBuilder.Redirect.DISCARD);
    Process child = pb.start();
    BufferedReader out = new BufferedReader(new InputStreamReader(child.getInputStream(), StandardCharsets.UTF_8));
    String line = out.readLine();
    if (!"held".equals(line)) {
      child.destroyForcibly();
      throw new IllegalStateException("the holder JVM did not take its locks: " + line);
    }
    Taker[] waiters = {
      lockTaker(ours.getLock("t0")), lockTaker(ours.getLock("t1")), lockTaker(redisson.getLock("t2")),
      lockTaker(registry(RedisLockRegistry.RedisLockType.SPIN_LOCK).obtain("t3")),
      lockTaker(registry(RedisLockRegistry.RedisLockType.PUB_SUB_LOCK).obtain("t4")), shedTaker(shedlock, "t5")};
    List<CompletableFuture<Long>> got = new ArrayList<>();
    for (Taker w : waiters) {
      CompletableFuture<Long> f = new CompletableFuture<>();
      got.add(f);
      Thread th = new Thread(() -> {
        try {
          Release r = w.take();
          f.complete(System.nanoTime());
          r.release();
        } catch (Throwable e) {
          f.completeExceptionally(e);
        }
      });
      th.setDaemon(true);
      th.start();
    }
    Thread.sleep(500); // the waiters are parked or polling
    long killed = System.nanoTime();
    child.destroyForcibly(); // SIGKILL
    child.waitFor();
    String[] result = new String[waiters.length];
    for (int i = 0; i < waiters.length; i++) {
      try {
        result[i] = fmtMs(got.get(i).get(LEASE.toSeconds() + 30, TimeUnit.SECONDS) - killed);
      } catch (java.util.concurrent.TimeoutException e) {
        result[i] = "no takeover within " + (LEASE.toSeconds() + 30) + " s";
      }
    }
    return result;
  }

  // ---- the run ----

  /** Lettuce's log of a message reaching a Spring listener container just destroyed: noise here. */
  static final java.util.logging.Logger LETTUCE_LOG = java.util.logging.Logger.getLogger("io.lettuce.core");

  public static void main(String[] args) throws Exception {
    LETTUCE_LOG.setLevel(java.util.logging.Level.OFF);
    if (args.length == 2 && args[0].equals("hold")) {
      hold(Integer.parseInt(args[1]));
      return;
    }
    // `Bench several`: only the several-at-once tables.
    boolean severalOnly = args.length == 1 && args[0].equals("several");
    Server srv = Server.start();
    RedisClient rc = RedisClient.create(RedisURI.create("127.0.0.1", srv.port));
    try (srv; StatefulRedisConnection<String, String> conn = rc.connect()) {
      Bench b = new Bench(srv.port, conn.sync());
      try {
        if (severalOnly) {
          new SeveralAtOnce(b).print();
        } else {
          b.run(conn.sync());
        }
      } finally {
        b.close();
        rc.shutdown();
      }
    }
    // A Redisson client left with interrupted waiters may keep threads alive
    // after its shutdown: the bench ends all the same.
    System.exit(0);
  }

  void run(RedisCommands<String, String> c) throws Exception {
    String server = version(c.info("server"));
    long started = System.nanoTime();
    System.out.printf(Locale.ROOT, "One server (%s, loopback, the module loaded), one JVM (Java %s); %s UTC.%n%n",
        server, System.getProperty("java.version"), Instant.now().toString().substring(0, 16).replace('T', ' '));

    System.out.println("| lock | uncontended lock+unlock /s | 32 threads: acquisitions /s | wait p50 | wait p99 "
        + "| wait max | fewest / most per thread | server commands per acquisition |");
    System.out.println("|---|---|---|---|---|---|---|---|");
    int n = 0;
    for (Lib lib : mutexes()) {
      progress(lib.name());
      double un = uncontended(lib, "u" + n);
      // Unmeasured first: the JIT, and the connections a library opens as threads wait.
      contended(lib, "w" + n, WARMUP);
      Stats s = contended(lib, "c" + n, CONTENDED_RUN);
      n++;
      System.out.printf(Locale.ROOT, "| %s | %,.0f | %,.0f | %s | %s | %s | %d / %d | %.1f |%n", lib.name(), un, s.rate(),
          s.ms(0.5), s.ms(0.99), s.ms(1), s.fewest(), s.most(), s.cmds());
      closeRegistries();
    }

    System.out.println();
    System.out.println("| read-write lock, 32 threads | mix | acquisitions /s | wait p50 | wait p99 | wait max "
        + "| fewest / most per thread | server commands per acquisition |");
    System.out.println("|---|---|---|---|---|---|---|---|");
    for (double readShare : new double[] {0.9, 0.1}) {
      String mixName = readShare > 0.5 ? "90% reads" : "90% writes";
      DistributedReadWriteLock oursRw = ours.getReadWriteLock("rw-ours-" + readShare);
      RReadWriteLock theirs = redisson.getReadWriteLock("rw-redisson-" + readShare);
      Object[][] rows = {
        {"redislock `DistributedReadWriteLock` (this)", (Function<Integer, Taker>) i -> mix(oursRw.readLock(),
            oursRw.writeLock(), readShare)},
        {"Redisson `RReadWriteLock`", (Function<Integer, Taker>) i -> mix(theirs.readLock(), theirs.writeLock(),
            readShare)}};
      for (Object[] row : rows) {
        progress(row[0] + " " + mixName);
        @SuppressWarnings("unchecked")
        Function<Integer, Taker> f = (Function<Integer, Taker>) row[1];
        Taker[] takers = new Taker[THREADS];
        for (int i = 0; i < THREADS; i++) {
          takers[i] = f.apply(i);
        }
        contended(takers, WARMUP);
        Stats s = contended(takers);
        System.out.printf(Locale.ROOT, "| %s | %s | %,.0f | %s | %s | %s | %d / %d | %.1f |%n", row[0], mixName,
            s.rate(), s.ms(0.5), s.ms(0.99), s.ms(1), s.fewest(), s.most(), s.cmds());
      }
    }

    System.out.println();
    System.out.println("| semaphore of 8 permits, 32 threads (10 s leases) | acquisitions /s | wait p50 | wait p99 "
        + "| wait max | fewest / most per thread | server commands per acquisition |");
    System.out.println("|---|---|---|---|---|---|---|");
    DistributedSemaphore sem = ours.getSemaphore("sem-ours", 8);
    RPermitExpirableSemaphore rsem = redisson.getPermitExpirableSemaphore("sem-redisson");
    rsem.trySetPermits(8);
    Taker oursSem = () -> {
      Hold h = sem.acquire(10, TimeUnit.SECONDS);
      return () -> sem.release(h);
    };
    Taker redissonSem = () -> {
      String id = rsem.acquire(10, TimeUnit.SECONDS);
      return () -> rsem.release(id);
    };
    for (Object[] row : new Object[][] {{"redislock `DistributedSemaphore` (this)", oursSem},
        {"Redisson `RPermitExpirableSemaphore`", redissonSem}}) {
      progress((String) row[0]);
      Taker[] takers = new Taker[THREADS];
      Arrays.fill(takers, row[1]);
      contended(takers, WARMUP);
      Stats s = contended(takers);
      System.out.printf(Locale.ROOT, "| %s | %,.0f | %s | %s | %s | %d / %d | %.1f |%n", row[0], s.rate(), s.ms(0.5),
          s.ms(0.99), s.ms(1), s.fewest(), s.most(), s.cmds());
    }

    System.out.println();
    progress("takeover after a killed holder JVM (up to " + LEASE.toSeconds() + " s)");
    String[] t = takeover();
    closeRegistries();
    System.out.println("| holder JVM killed (`kill -9`) while a waiter waits | the waiter has the lock after |");
    System.out.println("|---|---|");
    for (int i = 0; i < t.length; i++) {
      System.out.printf("| %s | %s after the kill |%n", TAKEOVER[i], t[i]);
    }
    // Last: Redisson's multi-lock rows leave waiters behind that do not stop.
    new SeveralAtOnce(this).print();
    System.out.printf(Locale.ROOT, "%nWhole run: %.0f s.%n", (System.nanoTime() - started) / 1e9);
  }

  static void progress(String what) {
    System.err.println("bench-java: " + what);
  }

  void closeRegistries() {
    RedisLockRegistry r;
    while ((r = made.poll()) != null) {
      r.destroy();
    }
  }

  void close() {
    closeRegistries();
    redisson.shutdown();
    spring.destroy();
    ours.close();
  }

  static String version(String info) {
    String name = "Redis";
    String ver = "?";
    for (String line : info.split("\r?\n")) {
      if (line.startsWith("redis_version:")) {
        ver = line.substring(14);
      }
      if (line.startsWith("valkey_version:")) {
        name = "Valkey";
        ver = line.substring(15);
      }
    }
    return name + " " + ver;
  }

  /** The server under test: {@code LOCK_SERVER} with {@code LOCK_MODULE} on a free loopback port. */
  static final class Server implements AutoCloseable {
    final int port;
    final Process process;
    final Path dir;

    Server(int port, Process process, Path dir) {
      this.port = port;
      this.process = process;
      this.dir = dir;
    }

    static Server start() throws IOException, InterruptedException {
      String bin = System.getenv().getOrDefault("LOCK_SERVER", "redis-server");
      String module = System.getenv("LOCK_MODULE");
      if (module == null || !Files.exists(Path.of(module))) {
        throw new IllegalStateException("LOCK_MODULE must name the built module");
      }
      int port;
      try (ServerSocket s = new ServerSocket(0)) {
        port = s.getLocalPort();
      }
      Path dir = Files.createTempDirectory("bench-java-");
      Process p = new ProcessBuilder(bin, "--port", String.valueOf(port), "--bind", "127.0.0.1", "--dir",
          dir.toString(), "--logfile", dir.resolve("redis.log").toString(), "--save", "", "--appendonly", "no",
          "--maxclients", "10000", "--loadmodule", module).redirectErrorStream(true)
          .redirectOutput(dir.resolve("out.log").toFile()).start();
      long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
      while (System.nanoTime() < end) {
        try {
          new java.net.Socket("127.0.0.1", port).close();
          return new Server(port, p, dir);
        } catch (IOException e) {
          Thread.sleep(20);
        }
      }
      p.destroyForcibly();
      throw new IOException("the server did not start; see " + dir);
    }

    @Override
    public void close() throws IOException {
      process.destroyForcibly();
      try (var files = Files.walk(dir)) {
        files.sorted(java.util.Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
      }
    }
  }
}
