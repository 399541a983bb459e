package io.redislock.conformance;

import io.lettuce.core.RedisURI;
import io.redislock.DistributedLock;
import io.redislock.DistributedReadWriteLock;
import io.redislock.DistributedSemaphore;
import io.redislock.Hold;
import io.redislock.LimitMismatchException;
import io.redislock.LockClient;
import io.redislock.LockLostException;
import io.redislock.LockOptions;
import io.redislock.LockTimeoutException;
import io.redislock.NotOwnerException;
import io.redislock.QuarantineException;
import io.redislock.Redlock;
import io.redislock.RefusedException;
import io.redislock.UpgradeRefusedException;
import io.redislock.WouldBlockException;
import io.redislock.WrongTypeException;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.io.UnsupportedEncodingException;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

/**
 * The Java client's driver for the project's client conformance suite: reads
 * requests of the line protocol in {@code docs/conformance.md} on standard
 * input, runs each on a thread, and writes replies and {@code ! lost} events
 * on standard output.
 *
 * <p>How the protocol's words map onto this client: {@code obj=} names a
 * {@link DistributedLock}, a {@link DistributedReadWriteLock} (each in an
 * owner scope of its own) or a {@link DistributedSemaphore}; {@code thread=}
 * names a Java thread (a single-thread executor), and owners are per thread,
 * so two calls on one object and one thread are a reentry; without it each
 * call runs on a new thread. {@code cancel=<ms>} interrupts the thread running
 * the call after that long ({@code Thread.interrupt}).
 */
public final class Driver {
  private final PrintStream out;
  private volatile LockClient client;
  private volatile Redlock redlock;
  private final Map<String, Hold> holds = new ConcurrentHashMap<>();
  private final Map<String, Object> objects = new ConcurrentHashMap<>();
  private final Map<String, ExecutorService> threads = new ConcurrentHashMap<>();
  private final ScheduledExecutorService cancels = Executors.newSingleThreadScheduledExecutor(r -> {
    Thread t = new Thread(r, "driver-cancel");
    t.setDaemon(true);
    return t;
  });
  /** Distinguishes this driver's owner scopes from another driver's on the same server. */
  private final String run = UUID.randomUUID().toString().substring(0, 8);

  private Driver(PrintStream out) {
    this.out = out;
  }

  public static void main(String[] args) throws Exception {
    if (args.length == 2 && args[0].equals("--warm")) {
      warm(args[1]);
      return;
    }
    PrintStream out = new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), false, "UTF-8");
    Driver d = new Driver(out);
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    for (String line; (line = in.readLine()) != null; ) {
      d.request(line);
    }
    // Standard input closed: open holds are abandoned, as a crashing application would leave them.
    Runtime.getRuntime().halt(0);
  }

  /**
   * Runs each path once against {@code url} and exits: the build runs this
   * with {@code -XX:ArchiveClassesAtExit} to write the class archive the
   * driver starts from (a JVM and Lettuce load thousands of classes; from
   * the archive they load in a fraction of the time).
   */
  private static void warm(String url) {
    try (LockClient c = LockClient.create(url)) {
      for (LockOptions o : new LockOptions[] {LockOptions.defaults(), LockOptions.defaults().waitMs(50),
          LockOptions.defaults().ephemeral(true)}) {
        try {
          c.getLock("warm").acquire(o).release();
          c.getReadWriteLock("warm-rw").readLock().acquire(o).release();
          c.getSemaphore("warm-sem", 2).acquire(o).release();
        } catch (InterruptedException | RuntimeException e) {
          System.err.println("warm-up: " + e);
        }
      }
    } catch (RuntimeException e) {
      System.err.println("warm-up: " + e);
    }
    System.exit(0);
  }

  /** One line out, flushed: replies and events never interleave mid-line. */
  private void emit(String line) {
    synchronized (out) {
      out.print(line);
      out.print('\n');
      out.flush();
    }
  }

  /** A failed request: its kind and a message for people. */
  private static final class Fail extends Exception {
    private static final long serialVersionUID = 1L;
    final String kind;

    Fail(String kind, String message) {
      super(message);
      this.kind = kind;
    }
  }

  private void request(String line) throws UnsupportedEncodingException {
    String[] words = line.trim().split(" +");
    if (words.length < 2) {
      return;
    }
    String id = words[0];
    String verb = words[1];
    if (verb.equals("quit")) {
      emit(id + " ok");
      Runtime.getRuntime().halt(0);
    }
    Map<String, String> args = new HashMap<>();
    for (int i = 2; i < words.length; i++) {
      int eq = words[i].indexOf('=');
      if (eq <= 0) {
        emit(id + " err bad-request not name=value: " + words[i]);
        return;
      }
      args.put(words[i].substring(0, eq), words[i].substring(eq + 1));
    }
    Runnable call = () -> runOne(id, verb, args);
    // Owners are per thread: calls on one object with no thread named run on
    // that object's own thread, so they share its owner as the protocol says.
    String thread = args.containsKey("thread") ? "t:" + args.get("thread")
        : args.containsKey("obj") ? "obj:" + args.get("obj") : null;
    if (thread == null) {
      Thread t = new Thread(call, "driver-" + id);
      t.setDaemon(true);
      t.start();
    } else {
      threads.computeIfAbsent(thread, n -> Executors.newSingleThreadExecutor(r -> {
        Thread t = new Thread(r, "driver-thread-" + n);
        t.setDaemon(true);
        return t;
      })).execute(call);
    }
  }

  /** The running call, interrupted by its {@code cancel=} unless it has finished. */
  private static final class Call {
    private final Thread thread = Thread.currentThread();
    private boolean finished;

    synchronized void cancel() {
      if (!finished) {
        thread.interrupt();
      }
    }

    synchronized void finish() {
      finished = true;
      // An interrupt that came as the call ended must not reach the next call on this thread.
      Thread.interrupted();
    }
  }

  private void runOne(String id, String verb, Map<String, String> args) {
    Call call = new Call();
    String reply;
    try {
      String cancel = args.get("cancel");
      if (cancel != null) {
        cancels.schedule(call::cancel, ms(args, "cancel"), TimeUnit.MILLISECONDS);
      }
      String fields = run(verb, args);
      reply = fields.isEmpty() ? id + " ok" : id + " ok " + fields;
    } catch (Fail f) {
      reply = id + " err " + f.kind + " " + f.getMessage();
    } catch (InterruptedException e) {
      reply = id + " err cancelled the call was interrupted";
    } catch (WouldBlockException e) {
      reply = id + " err not-obtained " + e.getMessage();
    } catch (LockTimeoutException e) {
      reply = id + " err timeout " + e.getMessage();
    } catch (NotOwnerException | WrongTypeException e) {
      reply = id + " err not-owner " + e.getMessage();
    } catch (LockLostException e) {
      reply = id + " err lost " + e.getMessage();
    } catch (UpgradeRefusedException e) {
      reply = id + " err upgrade " + e.getMessage();
    } catch (LimitMismatchException e) {
      reply = id + " err limit-mismatch " + e.getMessage();
    } catch (QuarantineException e) {
      reply = id + " err quarantine " + e.getMessage();
    } catch (RefusedException e) {
      reply = id + " err refused " + e.getMessage();
    } catch (RuntimeException e) {
      reply = id + " err transport " + e;
    } catch (Error e) {
      e.printStackTrace();
      reply = id + " err transport " + e;
    } finally {
      call.finish();
    }
    emit(reply.replace('\n', ' '));
  }

  private String run(String verb, Map<String, String> args) throws Fail, InterruptedException {
    switch (verb) {
      case "connect":
        connect(args);
        return "";
      case "acquire":
        return acquire(args);
      case "renew": {
        Hold h = hold(args);
        if (args.containsKey("ttl")) {
          h.renew(ms(args, "ttl"));
        } else {
          h.renew();
        }
        return "";
      }
      case "release": {
        Hold h = hold(args);
        if ("1".equals(args.get("all"))) {
          h.releaseAll();
          return "";
        }
        return "left=" + h.release();
      }
      case "stop-renew":
        hold(args).stopWatchdog();
        return "";
      case "resume":
        return resume(args);
      case "status": {
        Hold h = hold(args);
        boolean lost = h.isLost();
        return "held=" + (h.isHeld() ? 1 : 0) + " lost=" + (lost ? 1 : 0) + " reason="
            + (lost ? h.lossReason().wireName() : "-") + " fence=" + h.fence();
      }
      case "leaks":
        return "running=" + (redlock != null ? redlock.backgroundActivities() : client().backgroundActivities());
      default:
        throw new Fail("unsupported", "unknown verb " + verb);
    }
  }

  private LockClient client() throws Fail {
    LockClient c = client;
    if (c == null) {
      throw new Fail("bad-request", "connect first");
    }
    return c;
  }

  private void connect(Map<String, String> args) throws Fail {
    String topology = args.getOrDefault("topology", "single");
    switch (topology) {
      case "single":
        client = LockClient.create(need(args, "url"));
        return;
      case "sentinel": {
        URI u = URI.create(need(args, "url"));
        client = LockClient.create(RedisURI.Builder.sentinel(u.getHost(), u.getPort(), need(args, "master")).build());
        return;
      }
      case "redlock":
        redlock = Redlock.create(java.util.Arrays.asList(need(args, "urls").split(",")));
        return;
      case "cluster":
        client = LockClient.createCluster(need(args, "url"));
        return;
      default:
        throw new Fail("bad-request", "unknown topology " + topology);
    }
  }

  private static String need(Map<String, String> args, String name) throws Fail {
    String v = args.get(name);
    if (v == null) {
      throw new Fail("bad-request", "missing " + name + "=");
    }
    return v;
  }

  private static long ms(Map<String, String> args, String name) throws Fail {
    String v = need(args, name);
    try {
      long n = Long.parseLong(v);
      if (n < 0) {
        throw new NumberFormatException();
      }
      return n;
    } catch (NumberFormatException e) {
      throw new Fail("bad-request", name + "= is not a number of ms: " + v);
    }
  }

  private Hold hold(Map<String, String> args) throws Fail {
    String h = need(args, "h");
    Hold hold = holds.get(h);
    if (hold == null) {
      throw new Fail("bad-request", "no hold h=" + h);
    }
    return hold;
  }

  private static LockOptions options(Map<String, String> args) throws Fail {
    LockOptions o = LockOptions.defaults();
    if (args.containsKey("ttl")) {
      o = o.ttl(ms(args, "ttl"));
    }
    String wait = args.get("wait");
    if ("forever".equals(wait)) {
      o = o.waitForever();
    } else if (wait != null) {
      long w = ms(args, "wait");
      // wait=0 still means a wait through the server (a try would say not-obtained, not timeout).
      o = w == 0 ? o.waitMs(1) : o.waitMs(w);
    }
    String renew = args.getOrDefault("renew", "auto");
    if (renew.equals("off")) {
      o = o.watchdog(false);
    } else if (!renew.equals("auto")) {
      throw new Fail("bad-request", "renew=" + renew);
    }
    String eph = args.getOrDefault("ephemeral", "0");
    if (eph.equals("1")) {
      o = o.ephemeral(true);
    } else if (!eph.equals("0")) {
      throw new Fail("bad-request", "ephemeral=" + eph);
    }
    return o;
  }

  /** The object named {@code obj=}, made on first use; without it, a new one. */
  private Object object(Map<String, String> args, String kind, String key) throws Fail {
    String name = args.get("obj");
    int limit = 1;
    if (args.containsKey("limit")) {
      try {
        limit = Integer.parseInt(args.get("limit"));
      } catch (NumberFormatException e) {
        throw new Fail("bad-request", "limit=" + args.get("limit"));
      }
    }
    if (name == null) {
      return make(kind, key, limit, run + "-" + UUID.randomUUID());
    }
    Object o = objects.get(name);
    if (o == null) {
      o = make(kind, key, limit, run + "-" + name);
      Object raced = objects.putIfAbsent(name, o);
      if (raced != null) {
        o = raced;
      }
    }
    return o;
  }

  private Object make(String kind, String key, int limit, String scope) throws Fail {
    switch (kind) {
      case "lock":
        return client().getLock(key, scope);
      case "read":
      case "write":
        return client().getReadWriteLock(key, scope);
      case "permit":
        return client().getSemaphore(key, limit);
      default:
        throw new Fail("bad-request", "kind=" + kind);
    }
  }

  private String acquire(Map<String, String> args) throws Fail, InterruptedException {
    String h = need(args, "h");
    String kind = args.getOrDefault("kind", "lock");
    LockOptions opts = options(args);
    if (args.containsKey("keys")) {
      if (redlock != null || !kind.equals("lock")) {
        throw new Fail("unsupported", "several keys at once: exclusive locks on one server");
      }
      Hold hold = client().acquireAll(List.of(args.get("keys").split(",")), opts);
      holds.put(h, hold);
      hold.lost().thenAccept(reason -> emit("! lost h=" + h + " reason=" + reason.wireName()));
      StringBuilder fences = new StringBuilder();
      for (Long f : hold.fences()) {
        fences.append(fences.length() == 0 ? "" : ",").append(f);
      }
      return "fence=" + hold.fences().get(0) + " fences=" + fences + " owner=" + hold.owner();
    }
    String key = need(args, "key");
    if (redlock != null) {
      if (!kind.equals("lock")) {
        throw new Fail("unsupported", "Redlock has exclusive locks only");
      }
      return keep(h, redlock.acquire(key, opts));
    }
    Object obj = object(args, kind, key);
    Hold hold;
    if (obj instanceof DistributedLock) {
      hold = ((DistributedLock) obj).acquire(opts);
    } else if (obj instanceof DistributedReadWriteLock) {
      DistributedReadWriteLock rw = (DistributedReadWriteLock) obj;
      hold = (kind.equals("read") ? rw.readLock() : rw.writeLock()).acquire(opts);
    } else if (obj instanceof DistributedSemaphore) {
      DistributedSemaphore sem = (DistributedSemaphore) obj;
      if (args.containsKey("limit") && Integer.parseInt(args.get("limit")) != sem.limit()) {
        // Another limit through the same object: ask the server with it, which refuses or grants.
        sem = client().getSemaphore(key, Integer.parseInt(args.get("limit")));
      }
      hold = args.containsKey("permits") ? sem.acquire((int) ms(args, "permits"), opts) : sem.acquire(opts);
    } else {
      throw new Fail("bad-request", "kind=" + kind);
    }
    return keep(h, hold);
  }

  private String resume(Map<String, String> args) throws Fail, InterruptedException {
    String h = need(args, "h");
    String key = need(args, "key");
    String owner = need(args, "owner");
    long ttl = ms(args, "ttl");
    Long fence = args.containsKey("fence") ? Long.valueOf(ms(args, "fence")) : null;
    boolean renew = !"off".equals(args.getOrDefault("renew", "auto"));
    return keep(h, client().resume(key, owner, ttl, fence, renew));
  }

  /** Files a hold under {@code h}, reports its loss as an event, and gives the reply's fields. */
  private String keep(String h, Hold hold) {
    holds.put(h, hold);
    hold.lost().thenAccept(reason -> emit("! lost h=" + h + " reason=" + reason.wireName()));
    return "fence=" + hold.fence() + " owner=" + hold.owner();
  }
}
