package io.redislock;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.api.sync.RedisCommands;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.output.NestedMultiOutput;
import io.lettuce.core.protocol.CommandArgs;
import java.io.IOException;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;

/**
 * A real server for one test class: {@code LOCK_SERVER} (default
 * {@code redis-server}) on a free loopback port, with the module
 * ({@code LOCK_MODULE}) loaded, its own temp dir, killed on close. {@link #cmd}
 * gives a plain Lettuce connection to look at the server from outside the
 * client under test.
 */
public final class TestServer implements AutoCloseable {
  final int port;
  private final Process process;
  private final Path dir;
  private final RedisClient observerClient;
  private final StatefulRedisConnection<String, String> observer;

  private TestServer(int port, Process process, Path dir) {
    this.port = port;
    this.process = process;
    this.dir = dir;
    this.observerClient = RedisClient.create(RedisURI.create("127.0.0.1", port));
    this.observer = observerClient.connect(StringCodec.UTF8);
  }

  static String module() {
    String m = System.getenv("LOCK_MODULE");
    if (m == null || m.isEmpty()) {
      m = Path.of("..", "target", "release", "libredislock.so").toAbsolutePath().normalize().toString();
    }
    if (!Files.exists(Path.of(m))) {
      throw new IllegalStateException("module " + m + " not found: build it (cargo build --release) or set LOCK_MODULE");
    }
    return m;
  }

  public static TestServer start(String... extra) throws IOException, InterruptedException {
    return start(false, extra);
  }

  /** A free port; for a cluster node, one whose bus port (port + 10000) is free too. */
  private static int freePort(boolean clusterNode) throws IOException {
    for (;;) {
      try (ServerSocket s = new ServerSocket(0)) {
        int port = s.getLocalPort();
        if (!clusterNode) {
          return port;
        }
        if (port + 10000 <= 65535) {
          try {
            new ServerSocket(port + 10000).close();
            return port;
          } catch (IOException e) {
            // Its bus port is taken: another.
          }
        }
      }
    }
  }

  /** {@code clusterNode}: with cluster mode on (its bus on port + 10000). */
  static TestServer start(boolean clusterNode, String... extra) throws IOException, InterruptedException {
    String bin = System.getenv().getOrDefault("LOCK_SERVER", "redis-server");
    IOException last = null;
    for (int attempt = 0; attempt < 5; attempt++) {
      int port = freePort(clusterNode);
      Path dir = Files.createTempDirectory("redislock-java-");
      List<String> args = new ArrayList<>(List.of(bin, "--port", String.valueOf(port), "--bind", "127.0.0.1",
          "--dir", dir.toString(), "--logfile", dir.resolve("redis.log").toString(), "--save", "", "--appendonly", "no",
          "--enable-debug-command", "yes", "--loadmodule", module()));
      if (clusterNode) {
        args.addAll(List.of("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", "5000"));
      }
      args.addAll(List.of(extra));
      Process p = new ProcessBuilder(args).redirectErrorStream(true).redirectOutput(dir.resolve("out.log").toFile())
          .start();
      long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
      while (System.nanoTime() < end && p.isAlive()) {
        try (Socket probe = new Socket("127.0.0.1", port)) {
          probe.getOutputStream().write("PING\r\n".getBytes());
          byte[] buf = new byte[7];
          int n = probe.getInputStream().read(buf);
          if (n > 0 && new String(buf, 0, n).startsWith("+PONG")) {
            return new TestServer(port, p, dir);
          }
        } catch (IOException e) {
          last = e;
        }
        Thread.sleep(10);
      }
      p.destroyForcibly().waitFor();
    }
    throw new IOException("the server did not start", last);
  }

  public String url() {
    return "redis://127.0.0.1:" + port;
  }

  public RedisCommands<String, String> cmd() {
    return observer.sync();
  }

  /** {@code LOCK.INFO key} as a flat list (null when free). */
  List<Object> info(String key) {
    return cmd().dispatch(new RawCmd("LOCK.INFO"),
        new NestedMultiOutput<>(StringCodec.UTF8), new CommandArgs<>(StringCodec.UTF8).addKey(key));
  }

  /** A field of {@code LOCK.INFO key}; null when the lock is free. */
  Object infoField(String key, String field) {
    List<Object> info = info(key);
    if (info == null || info.isEmpty()) {
      return null;
    }
    for (int i = 0; i + 1 < info.size(); i += 2) {
      if (field.equals(String.valueOf(info.get(i)))) {
        return info.get(i + 1);
      }
    }
    return null;
  }

  /** Polls until {@code cond} holds; fails after {@code timeout}. */
  static void waitUntil(String what, Duration timeout, BooleanSupplier cond) throws InterruptedException {
    long end = System.nanoTime() + timeout.toNanos();
    while (!cond.getAsBoolean()) {
      if (System.nanoTime() > end) {
        throw new AssertionError("timed out waiting until " + what);
      }
      Thread.sleep(5);
    }
  }

  static final class RawCmd implements io.lettuce.core.protocol.ProtocolKeyword {
    private final String name;

    RawCmd(String name) {
      this.name = name;
    }

    @Override
    public byte[] getBytes() {
      return name.getBytes(java.nio.charset.StandardCharsets.US_ASCII);
    }

    @Override
    public String toString() {
      return name;
    }
  }

  /** kill -9, the server gone for the rest of the test. */
  void kill() throws InterruptedException {
    process.destroyForcibly().waitFor();
  }

  @Override
  public void close() throws IOException {
    observer.close();
    observerClient.shutdown(Duration.ZERO, Duration.ofSeconds(2));
    try {
      process.destroyForcibly().waitFor();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
    try (var files = Files.walk(dir)) {
      files.sorted(java.util.Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
    }
  }
}
