package io.redislock;

import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.RedisException;
import io.lettuce.core.cluster.api.async.RedisClusterAsyncCommands;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.output.CommandOutput;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.ProtocolKeyword;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;

/**
 * The module's commands on a Lettuce connection: their names, the one reply
 * shape they share (an integer, or nil), and the server's error replies
 * sorted into the exception classes.
 */
final class Protocol {
  private Protocol() {}

  /**
   * The {@code LOCK.*} commands this client sends. (A class, not an enum: an
   * enum's own {@code name()} would override the interface's deprecated one.)
   */
  static final class Cmd implements ProtocolKeyword {
    static final Cmd ACQUIRE = new Cmd("LOCK.ACQUIRE");
    static final Cmd REENTER = new Cmd("LOCK.REENTER");
    static final Cmd RELEASE = new Cmd("LOCK.RELEASE");
    static final Cmd RENEW = new Cmd("LOCK.RENEW");
    static final Cmd FENCE = new Cmd("LOCK.FENCE");
    static final Cmd MACQUIRE = new Cmd("LOCK.MACQUIRE");
    static final Cmd MRENEW = new Cmd("LOCK.MRENEW");
    static final Cmd MRELEASE = new Cmd("LOCK.MRELEASE");

    private final byte[] bytes;
    private final String text;

    private Cmd(String text) {
      this.text = text;
      this.bytes = text.getBytes(StandardCharsets.US_ASCII);
    }

    @Override
    public byte[] getBytes() {
      return bytes;
    }

    @Override
    public String toString() {
      return text;
    }
  }

  /**
   * An integer reply, or null for nil: fences, counts, the renew's 1. An
   * array of integers ({@code LOCK.MACQUIRE}'s fences, {@code LOCK.MRELEASE}'s
   * counts) reads as its last, every one kept in {@link #all}.
   */
  static final class LongOrNil extends CommandOutput<String, String, Long> {
    final List<Long> all = new ArrayList<>();

    LongOrNil() {
      super(StringCodec.UTF8, null);
    }

    @Override
    public void set(long integer) {
      output = integer;
      all.add(integer);
    }

    @Override
    public void set(ByteBuffer bytes) {
      // nil ($-1 / _): not granted. A bulk string would be a protocol surprise.
      output = bytes == null ? null : Long.parseLong(decodeString(bytes));
    }
  }

  static CompletableFuture<Long> send(RedisClusterAsyncCommands<String, String> conn, Cmd cmd, Object... args) {
    CommandArgs<String, String> a = new CommandArgs<>(StringCodec.UTF8);
    a.addKey((String) args[0]);
    for (int i = 1; i < args.length; i++) {
      a.add(String.valueOf(args[i]));
    }
    return conn.dispatch(cmd, new LongOrNil(), a).toCompletableFuture();
  }

  /**
   * {@code LOCK.ACQUIRE key owner ttl [SHARED [LIMIT n [PERMITS k]]] [EPHEMERAL] [WAIT w]},
   * or for a kind of several keys {@code LOCK.MACQUIRE numkeys key... owner ttl ...}:
   * the fence (the highest, for several keys), or null; {@code fences}, when
   * given, receives every key's fence in key order.
   */
  static CompletableFuture<Long> acquire(RedisClusterAsyncCommands<String, String> conn, String key, String owner,
      long ttlMs, HoldKind kind, boolean ephemeral, long waitMs, List<Long> fences) {
    CommandArgs<String, String> a = new CommandArgs<>(StringCodec.UTF8);
    Cmd cmd = Cmd.ACQUIRE;
    if (kind.keys() == null) {
      a.addKey(key);
    } else {
      cmd = Cmd.MACQUIRE;
      a.add(kind.keys().size());
      for (String k : kind.keys()) {
        a.addKey(k);
      }
    }
    a.add(owner).add(ttlMs);
    if (kind.isShared()) {
      a.add("SHARED");
      if (kind.limit() > 0) {
        a.add("LIMIT").add(kind.limit());
        // One permit is the server's default: servers that predate PERMITS
        // keep serving single permits.
        if (kind.permits() != 1) {
          a.add("PERMITS").add(kind.permits());
        }
      }
    }
    if (ephemeral) {
      a.add("EPHEMERAL");
    }
    if (waitMs != LockOptions.NO_WAIT) {
      // WAIT 0 is the server's "no time limit".
      a.add("WAIT").add(waitMs == LockOptions.FOREVER ? 0 : waitMs);
    }
    LongOrNil out = new LongOrNil();
    return conn.dispatch(cmd, out, a).toCompletableFuture().thenApply(v -> {
      if (v == null) {
        return null;
      }
      if (fences != null) {
        fences.addAll(out.all);
      }
      return out.all.stream().max(Long::compare).orElse(v);
    });
  }

  /** {@code LOCK.RENEW}, or {@code LOCK.MRENEW} of every key of a kind of several. */
  static CompletableFuture<Long> renew(RedisClusterAsyncCommands<String, String> conn, String key, String owner,
      long ttlMs, HoldKind kind) {
    if (kind.keys() == null) {
      return send(conn, Cmd.RENEW, key, owner, ttlMs);
    }
    return several(conn, Cmd.MRENEW, kind.keys(), owner, String.valueOf(ttlMs));
  }

  /** {@code LOCK.RELEASE [ALL]}, or {@code LOCK.MRELEASE [ALL]} of every key (the count left). */
  static CompletableFuture<Long> release(RedisClusterAsyncCommands<String, String> conn, String key, String owner,
      HoldKind kind, boolean all) {
    if (kind.keys() == null) {
      return all ? send(conn, Cmd.RELEASE, key, owner, "ALL") : send(conn, Cmd.RELEASE, key, owner);
    }
    return all ? several(conn, Cmd.MRELEASE, kind.keys(), owner, "ALL")
        : several(conn, Cmd.MRELEASE, kind.keys(), owner);
  }

  private static CompletableFuture<Long> several(RedisClusterAsyncCommands<String, String> conn, Cmd cmd,
      List<String> keys, String owner, String... rest) {
    CommandArgs<String, String> a = new CommandArgs<>(StringCodec.UTF8);
    a.add(keys.size());
    for (String k : keys) {
      a.addKey(k);
    }
    a.add(owner);
    for (String r : rest) {
      a.add(r);
    }
    return conn.dispatch(cmd, new LongOrNil(), a).toCompletableFuture();
  }

  /** The error a failed reply means, unwrapped from Lettuce's and the future's wrappers. */
  static LockException map(Throwable err) {
    Throwable e = unwrap(err);
    if (e instanceof LockException) {
      return (LockException) e;
    }
    if (e instanceof RedisCommandExecutionException) {
      String msg = e.getMessage() == null ? "" : e.getMessage();
      if (msg.startsWith("NOTOWNER")) {
        return new NotOwnerException();
      }
      if (msg.startsWith("WRONGTYPE")) {
        return new WrongTypeException(msg);
      }
      if (msg.contains("holds the lock shared")) {
        return new UpgradeRefusedException();
      }
      if (msg.contains("another LIMIT")) {
        return new LimitMismatchException(msg);
      }
      if (msg.startsWith("ERR unknown command") && msg.toLowerCase().contains("lock.")) {
        return new ModuleNotLoadedException(e);
      }
      return new TransportException("the server answered: " + msg, e);
    }
    if (e instanceof RedisException) {
      return new TransportException("redis: " + e.getMessage(), e);
    }
    return new TransportException(String.valueOf(e), e);
  }

  static Throwable unwrap(Throwable err) {
    Throwable e = err;
    while ((e instanceof CompletionException || e instanceof ExecutionException) && e.getCause() != null) {
      e = e.getCause();
    }
    return e;
  }

  /** Whether the reply says this owner no longer holds the lock (NOTOWNER, or another type over the key). */
  static boolean meansNotOwner(Throwable err) {
    LockException e = map(err);
    return e instanceof NotOwnerException || e instanceof WrongTypeException;
  }
}
