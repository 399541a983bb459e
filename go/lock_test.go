package redislock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var bg = context.Background()

func TestTryLockIsRefusedWhileHeldAndFencesRise(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	a, err := c.TryLock(bg, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryLock(bg, "k"); !errors.Is(err, ErrNotObtained) {
		t.Fatalf("second TryLock: %v, want ErrNotObtained", err)
	}
	if got := s.owners(t, "k"); len(got) != 1 || got[0] != a.Owner() {
		t.Fatalf("holders %v, want [%s]", got, a.Owner())
	}
	if err := a.Release(bg); err != nil {
		t.Fatal(err)
	}
	if a.Context().Err() == nil {
		t.Fatal("a released lock's context is still live")
	}
	if a.Lost() != nil {
		t.Fatalf("a released lock reports a loss: %v", a.Lost())
	}
	b, err := c.TryLock(bg, "k")
	if err != nil {
		t.Fatal(err)
	}
	if b.Fence() <= a.Fence() {
		t.Fatalf("fence %d after %d: fences must rise", b.Fence(), a.Fence())
	}
	if err := a.Release(bg); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("second release: %v, want ErrNotOwner", err)
	}
	if err := b.Release(bg); err != nil {
		t.Fatal(err)
	}
}

func TestWaitersGetTheLockOneAtATime(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	var inside, total atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				l, err := c.Lock(bg, "counter", WithTTL(5*time.Second))
				if err != nil {
					t.Error(err)
					return
				}
				if n := inside.Add(1); n != 1 {
					t.Errorf("%d holders at once", n)
				}
				time.Sleep(time.Millisecond)
				total.Add(1)
				inside.Add(-1)
				if err := l.Release(bg); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if total.Load() != 40 {
		t.Fatalf("%d holds, want 40", total.Load())
	}
	waitFor(t, "no background activity", 2*time.Second, func() bool { return c.Running() == 0 })
}

func TestWaitWithALimitTimesOutAndIsToldApartFromCancel(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	a, err := c.Lock(bg, "k")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = c.Lock(bg, "k", WithWait(100*time.Millisecond))
	if !errors.Is(err, ErrTimedOut) || errors.Is(err, ErrCancelled) {
		t.Fatalf("bounded wait: %v, want ErrTimedOut", err)
	}
	if d := time.Since(start); d < 90*time.Millisecond || d > 2*time.Second {
		t.Fatalf("bounded wait took %v", d)
	}
	ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
	defer cancel()
	_, err = c.Lock(ctx, "k")
	if !errors.Is(err, ErrCancelled) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrTimedOut) {
		t.Fatalf("wait bounded by the context: %v, want ErrCancelled wrapping DeadlineExceeded", err)
	}
	_ = a.Release(bg)
}

func TestWaiterIsHandedTheLockOnRelease(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	a, err := c.Lock(bg, "k")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lock, 1)
	go func() {
		l, err := c.Lock(bg, "k")
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitFor(t, "the second client waits", 5*time.Second, func() bool { return s.waiters("k") == 1 })
	if err := a.Release(bg); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-got:
		if b == nil {
			t.FailNow()
		}
		if b.Fence() <= a.Fence() {
			t.Fatalf("handed-over fence %d not above %d", b.Fence(), a.Fence())
		}
		_ = b.Release(bg)
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter never got the lock")
	}
}

func TestWatchdogKeepsTheLockPastItsLease(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	l, err := c.Lock(bg, "k", WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if !l.Held() {
		t.Fatalf("lost after 1 s with the watchdog on: %v", l.Lost())
	}
	if got := s.owners(t, "k"); len(got) != 1 {
		t.Fatalf("holders %v after 1 s", got)
	}
	if err := l.Release(bg); err != nil {
		t.Fatal(err)
	}
	if s.owners(t, "k") != nil {
		t.Fatal("still held after the release")
	}
}

func TestLossFiresBeforeTheServerLeaseEndsUnderClientPause(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	l, err := c.Lock(bg, "k", WithTTL(600*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// Renewals are writes: the pause holds them until after the lease.
	s.pauseWrites(t, 2*time.Second)
	// Read once writes are paused (a read is not): no renewal moves the
	// lease after this.
	pexpire, err := s.rdb.Do(bg, "PEXPIRETIME", "k").Int64()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
	case <-time.After(3 * time.Second):
		t.Fatal("no loss while the server refused every renewal")
	}
	lostAt := time.Now().UnixMilli()
	var le *LostError
	if !errors.As(context.Cause(l.Context()), &le) || le.Reason != ReasonExpired {
		t.Fatalf("cause %v, want a *LostError expired", context.Cause(l.Context()))
	}
	// The server's lease end is at least the first PEXPIRETIME (renewals
	// only move it later): the loss must come no later.
	if lostAt > pexpire {
		t.Fatalf("loss at %d ms, after the server's lease end %d", lostAt, pexpire)
	}
	if !errors.Is(l.Lost(), ErrLost) || l.Held() {
		t.Fatal("the loss is not reported")
	}
	if err := l.Renew(bg); !errors.Is(err, ErrLost) {
		t.Fatalf("renew after the loss: %v, want ErrLost", err)
	}
	s.rdb.Do(bg, "CLIENT", "UNPAUSE")
	if err := l.Release(bg); !errors.Is(err, ErrLost) {
		t.Fatalf("release after the loss: %v, want ErrLost", err)
	}
	waitFor(t, "no background activity", 3*time.Second, func() bool { return c.Running() == 0 })
}

func TestWatchdogSurvivesKilledConnectionsAndSeesNotOwner(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	l, err := c.Lock(bg, "k", WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		s.killClients(t)
		time.Sleep(400 * time.Millisecond)
	}
	if !l.Held() {
		t.Fatalf("lost after killed connections: %v", l.Lost())
	}
	// Someone deletes the lock: the next renewal hears NOTOWNER.
	s.rdb.Del(bg, "k")
	select {
	case <-l.Context().Done():
	case <-time.After(2 * time.Second):
		t.Fatal("no loss after the lock was deleted")
	}
	if !errors.Is(l.Lost(), ErrNotOwner) {
		t.Fatalf("loss %v, want not-owner", l.Lost())
	}
}

func TestEphemeralHoldIsLostWithinMillisecondsOfItsConnection(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	l, err := c.Lock(bg, "k", Ephemeral(), WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s.killClients(t)
	select {
	case <-l.Context().Done():
	case <-time.After(time.Second):
		t.Fatal("no loss after the hold's connection was killed")
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("loss %v after the kill", d)
	}
	var le *LostError
	if !errors.As(l.Lost(), &le) || le.Reason != ReasonDisconnected {
		t.Fatalf("loss %v, want disconnected", l.Lost())
	}
	if s.owners(t, "k") != nil {
		t.Fatal("the server still holds the ephemeral lock")
	}
	waitFor(t, "no background activity", 2*time.Second, func() bool { return c.Running() == 0 })

	// A released ephemeral hold closes its connection; the lock is free.
	l2, err := c.Lock(bg, "k", Ephemeral())
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Release(bg); err != nil {
		t.Fatal(err)
	}
	if l2.Lost() != nil || s.owners(t, "k") != nil {
		t.Fatal("a released ephemeral hold is lost or still held")
	}
	waitFor(t, "no background activity", 2*time.Second, func() bool { return c.Running() == 0 })
}

func TestStopRenewingKeepsTheHoldUntilItsLeaseThenLosesIt(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	l, err := c.Lock(bg, "k", WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	l.StopRenewing()
	if s.owners(t, "k") == nil {
		t.Fatal("stopping the watchdog released the lock")
	}
	select {
	case <-l.Context().Done():
	case <-time.After(2 * time.Second):
		t.Fatal("no loss at the deadline without renewals")
	}
	var le *LostError
	if !errors.As(l.Lost(), &le) || le.Reason != ReasonExpired {
		t.Fatalf("loss %v, want expired", l.Lost())
	}
	waitFor(t, "the lease ends on the server", 2*time.Second, func() bool { return s.owners(t, "k") == nil })
}

func TestRenewForSetsANewLease(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	l, err := c.Lock(bg, "k", WithTTL(time.Second), WithoutWatchdog())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.RenewFor(bg, time.Minute); err != nil {
		t.Fatal(err)
	}
	pttl, _ := s.rdb.PTTL(bg, "k").Result()
	if pttl < 50*time.Second {
		t.Fatalf("PTTL %v after renewing for a minute", pttl)
	}
	if time.Until(l.Deadline()) < 50*time.Second {
		t.Fatalf("deadline %v away after renewing for a minute", time.Until(l.Deadline()))
	}
	_ = l.Release(bg)
}

func TestLeasesUpTo2To40MsAreAccepted(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	long := time.Duration(maxMs) * time.Millisecond
	l, err := c.Lock(bg, "k", WithTTL(long), WithWait(long))
	if err != nil {
		t.Fatal(err)
	}
	pttl, _ := s.rdb.PTTL(bg, "k").Result()
	if pttl < long-time.Hour {
		t.Fatalf("PTTL %v, want about %v", pttl, long)
	}
	if _, err := c.Lock(bg, "k", WithTTL(long+time.Millisecond)); !errors.Is(err, ErrRefused) {
		t.Fatalf("a lease past 2^40 ms: %v, want ErrRefused", err)
	}
	ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	if _, err := c.Lock(ctx, "k", WithWait(long)); !errors.Is(err, ErrCancelled) {
		t.Fatalf("a 2^40 ms wait cancelled: %v", err)
	}
	if err := l.Release(bg); err != nil {
		t.Fatal(err)
	}
}

func TestResumeContinuesAHoldByItsOwnerToken(t *testing.T) {
	s := startServer(t)
	scheduler, worker := s.client(t), s.client(t)
	l, err := scheduler.Lock(bg, "job")
	if err != nil {
		t.Fatal(err)
	}
	l.StopRenewing()
	w, err := worker.Resume(bg, "job", l.Owner(), 0, WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if w.Fence() != l.Fence() {
		t.Fatalf("resumed fence %d, want %d", w.Fence(), l.Fence())
	}
	if err := w.Release(bg); err != nil {
		t.Fatal(err)
	}
	if s.owners(t, "job") != nil {
		t.Fatal("still held after the worker's release")
	}
	if _, err := worker.Resume(bg, "job", l.Owner(), 0); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("resuming a released hold: %v, want ErrNotOwner", err)
	}
}

func TestLockerAdaptsToSyncLocker(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	var mu sync.Locker = c.Locker("k", func(err error) { t.Error(err) })
	n := 0
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				mu.Lock()
				v := n
				time.Sleep(100 * time.Microsecond)
				n = v + 1
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if n != 40 {
		t.Fatalf("counter %d, want 40: the Locker let two in at once", n)
	}
}

func TestWatchdogRenewsForTheNewTTLAfterRenewFor(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	l, err := c.Lock(bg, "k", WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.RenewFor(bg, 600*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// Three leases of the new ttl later the watchdog has kept the hold,
	// renewing for the new ttl (not a third of the old one).
	if time.Until(l.Deadline()) > 600*time.Millisecond {
		t.Fatalf("deadline %v away after renewing for 600 ms", time.Until(l.Deadline()))
	}
	time.Sleep(1800 * time.Millisecond)
	if !l.Held() {
		t.Fatalf("lost: %v", l.Lost())
	}
	pttl, _ := s.rdb.PTTL(bg, "k").Result()
	if pttl <= 0 || pttl > 600*time.Millisecond {
		t.Fatalf("PTTL %v, want at most the new 600 ms", pttl)
	}
	_ = l.Release(bg)
}

func TestAGrantGoneBeforeItsConfirmingRenewWaitsAgain(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	if err := s.rdb.Do(bg, "LOCK.ACQUIRE", "k", "other", "30000").Err(); err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   *Lock
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := c.Lock(bg, "k", WithTTL(600*time.Millisecond), WithWait(20*time.Second))
		done <- result{l, err}
	}()
	waitFor(t, "the waiter parks", 5*time.Second, func() bool { return s.waiters("k") == 1 })
	time.Sleep(250 * time.Millisecond) // past a third of its lease: the grant needs confirming
	// Grant it, then delete the lock and let a thief take it, all before
	// the waiter's confirming renew can arrive.
	pipe := s.rdb.Pipeline()
	pipe.Do(bg, "LOCK.RELEASE", "k", "other")
	pipe.Do(bg, "DEL", "k")
	pipe.Do(bg, "LOCK.ACQUIRE", "k", "thief", "600000")
	if _, err := pipe.Exec(bg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the waiter queues again", 5*time.Second, func() bool { return s.waiters("k") == 1 })
	select {
	case r := <-done:
		t.Fatalf("returned instead of waiting again: %v", r.err)
	case <-time.After(200 * time.Millisecond):
	}
	s.rdb.Do(bg, "LOCK.RELEASE", "k", "thief")
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := s.owners(t, "k"); len(got) != 1 || got[0] != r.l.Owner() {
		t.Fatalf("holders %v, want the waiter", got)
	}
	_ = r.l.Release(bg)
}

func TestAReenteredEphemeralHoldKeepsItsConnectionUntilTheLastRelease(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	h := c.Handle("k")
	first, err := h.Lock(bg, Ephemeral())
	if err != nil {
		t.Fatal(err)
	}
	second, err := h.Lock(bg, Ephemeral())
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(bg); err != nil {
		t.Fatal(err)
	}
	// The hold began on the first call's connection: closing it would end
	// the whole hold, the second count included.
	time.Sleep(50 * time.Millisecond)
	if got := s.owners(t, "k"); len(got) != 1 || got[0] != h.Owner() || !second.Held() {
		t.Fatalf("after releasing one of two counts: holders %v, second held %v (%v)", got, second.Held(), second.Lost())
	}
	s.killClients(t)
	select {
	case <-second.Context().Done():
	case <-time.After(time.Second):
		t.Fatal("no loss when the hold's connection was killed")
	}
	if s.owners(t, "k") != nil {
		t.Fatal("still held after its connection was killed")
	}
	waitFor(t, "no background activity", 2*time.Second, func() bool { return c.Running() == 0 })
}
