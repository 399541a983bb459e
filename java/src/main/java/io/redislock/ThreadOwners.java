package io.redislock;

import java.util.concurrent.ConcurrentHashMap;

/**
 * The per-thread owners of one lock name, shared by every handle of that name
 * in one scope ({@link DistributedLock}, both sides of a
 * {@link DistributedReadWriteLock}): a thread's owner token is
 * {@code <scope>:<thread id>}, so a thread that holds the lock reenters it,
 * and the writer may take the read side, whichever handle it goes through.
 *
 * <p>A thread's hold that was lost is never reentered: the next acquire takes
 * a fresh hold under a new generation of the token, so a stale hold the
 * server may still count for a few ms is not mistaken for ours.
 */
final class ThreadOwners {
  final LockClient client;
  final String key;
  private final String scope;
  /** Touched by its own thread only, except to read a hold. */
  private final ConcurrentHashMap<Long, Slot> slots = new ConcurrentHashMap<>();

  private static final class Slot {
    volatile Hold hold;
    int generation;
  }

  ThreadOwners(LockClient client, String key, String scope) {
    this.client = client;
    this.key = key;
    this.scope = scope;
  }

  private static long threadId() {
    return Thread.currentThread().getId();
  }

  /** The calling thread's owner token now. */
  String owner() {
    Slot s = slots.get(threadId());
    return token(threadId(), s == null ? 0 : s.generation);
  }

  private String token(long tid, int generation) {
    return scope + ":" + tid + (generation == 0 ? "" : "." + generation);
  }

  /**
   * The calling thread takes the lock: a reentry (count + 1, lease reset) if
   * it holds it; the upgrade error at once if it holds it shared and asks
   * for it exclusively; else a fresh hold.
   */
  Hold acquire(HoldKind kind, LockOptions opts, boolean interruptible) throws InterruptedException {
    long tid = threadId();
    Slot s = slots.computeIfAbsent(tid, k -> new Slot());
    Hold h = s.hold;
    if (h != null && h.isHeld()) {
      if (h.kind().isShared() && !kind.isShared()) {
        throw new UpgradeRefusedException();
      }
      h.reenter(opts.ttlMs(), interruptible);
      return h;
    }
    if (h != null && h.lossReason() != null) {
      s.generation++;
    }
    try {
      Hold fresh = client.acquire(key, token(tid, s.generation), kind, opts, interruptible);
      s.hold = fresh;
      return fresh;
    } finally {
      if (s.hold == null || !s.hold.isHeld()) {
        forget(tid, s);
      }
    }
  }

  /** The calling thread's hold, if it holds the lock now. */
  Hold current() {
    Slot s = slots.get(threadId());
    Hold h = s == null ? null : s.hold;
    return h != null && h.isHeld() ? h : null;
  }

  /** Whether some thread holds the lock now. */
  boolean anyHeld() {
    for (Slot s : slots.values()) {
      Hold h = s.hold;
      if (h != null && h.isHeld()) {
        return true;
      }
    }
    return false;
  }

  /** The calling thread's last hold, held or not (its loss stays visible). */
  Hold last() {
    Slot s = slots.get(threadId());
    return s == null ? null : s.hold;
  }

  /** After a release: a thread whose hold ended cleanly needs no slot (lost ones keep their generation). */
  void released() {
    long tid = threadId();
    Slot s = slots.get(tid);
    if (s != null) {
      forget(tid, s);
    }
  }

  private void forget(long tid, Slot s) {
    Hold h = s.hold;
    if (s.generation == 0 && (h == null || (!h.isHeld() && h.lossReason() == null))) {
      slots.remove(tid, s);
    }
  }
}
