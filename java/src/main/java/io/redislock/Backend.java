package io.redislock;

import io.lettuce.core.cluster.api.async.RedisClusterAsyncCommands;
import java.util.concurrent.CompletableFuture;

/**
 * Where a {@link Hold} renews, reenters and releases: one server (over the
 * shared connection, or an ephemeral hold's own), or a Redlock majority.
 * Each call is one round; a failure is a {@link NotOwnerException} when the
 * hold is gone, anything else when it could not be told.
 */
interface Backend {
  CompletableFuture<Long> renew(String key, String owner, long ttlMs);

  CompletableFuture<Long> reenter(String key, String owner, long ttlMs);

  CompletableFuture<Long> release(String key, String owner, boolean all);

  /**
   * One server, the keys of a hold on several at once: every key renewed
   * and released together ({@code LOCK.MRENEW}, {@code LOCK.MRELEASE}, all
   * or none), so a renew refused because any key is gone loses the hold.
   */
  static Backend keys(Transport t, Transport.Dedicated bound, HoldKind kind) {
    return new Backend() {
      private RedisClusterAsyncCommands<String, String> conn() {
        return bound != null && bound.isOpen() ? bound.commands() : t.shared;
      }

      @Override
      public CompletableFuture<Long> renew(String key, String owner, long ttlMs) {
        return Protocol.renew(conn(), key, owner, ttlMs, kind);
      }

      @Override
      public CompletableFuture<Long> reenter(String key, String owner, long ttlMs) {
        return CompletableFuture.failedFuture(new RefusedException("a hold on several keys is not reentered"));
      }

      @Override
      public CompletableFuture<Long> release(String key, String owner, boolean all) {
        return Protocol.release(conn(), key, owner, kind, all);
      }
    };
  }

  /** One server: an ephemeral hold's commands go over its own connection while it is open. */
  static Backend single(Transport t, Transport.Dedicated bound) {
    return new Backend() {
      private RedisClusterAsyncCommands<String, String> conn() {
        return bound != null && bound.isOpen() ? bound.commands() : t.shared;
      }

      @Override
      public CompletableFuture<Long> renew(String key, String owner, long ttlMs) {
        return Protocol.send(conn(), Protocol.Cmd.RENEW, key, owner, ttlMs);
      }

      @Override
      public CompletableFuture<Long> reenter(String key, String owner, long ttlMs) {
        return Protocol.send(conn(), Protocol.Cmd.REENTER, key, owner, ttlMs);
      }

      @Override
      public CompletableFuture<Long> release(String key, String owner, boolean all) {
        return all ? Protocol.send(conn(), Protocol.Cmd.RELEASE, key, owner, "ALL")
            : Protocol.send(conn(), Protocol.Cmd.RELEASE, key, owner);
      }
    };
  }
}
