package redislock

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// free reports whether the server holds nothing on key.
func (s *server) free(key string) bool {
	return s.rdb.Exists(context.Background(), key).Val() == 0
}

func TestLockKeysTakesEveryKeyOrNone(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	keys := []string{"acct:1", "acct:2", "acct:3"}
	l, err := c.TryLockKeys(bg, keys, WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	fences := l.Fences()
	if len(fences) != 3 || !slices.IsSorted(fences) || l.Fence() != fences[2] {
		t.Fatalf("fences %v (Fence %d): one per key, in key order", fences, l.Fence())
	}
	if !slices.Equal(l.Keys(), keys) {
		t.Fatalf("Keys %v, want %v", l.Keys(), keys)
	}
	for _, k := range keys {
		if got := s.owners(t, k); len(got) != 1 || got[0] != l.Owner() {
			t.Fatalf("%s held by %v, want %s", k, got, l.Owner())
		}
	}
	if err := l.Release(bg); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if !s.free(k) {
			t.Fatalf("%s still held after the release", k)
		}
	}

	// One key held elsewhere: nothing is taken on the others.
	other, err := c.TryLock(bg, "acct:2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryLockKeys(bg, keys); !errors.Is(err, ErrNotObtained) {
		t.Fatalf("a key held elsewhere: %v, want ErrNotObtained", err)
	}
	if !s.free("acct:1") || !s.free("acct:3") {
		t.Fatal("a refused try left a key held")
	}
	_ = other.Release(bg)

	if _, err := c.TryLockKeys(bg, []string{"a", "b", "a"}); !errors.Is(err, ErrRefused) {
		t.Fatalf("a key named twice: %v, want ErrRefused", err)
	}
	if _, err := c.TryLockKeys(bg, nil); !errors.Is(err, ErrRefused) {
		t.Fatalf("no keys: %v, want ErrRefused", err)
	}
}

func TestLockKeysInCrossingOrdersAreServedInTurn(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	blocker, err := c.TryLock(bg, "x")
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		l   *Lock
		err error
	}
	first, second := make(chan got, 1), make(chan got, 1)
	go func() {
		l, err := c.LockKeys(bg, []string{"x", "y"}, WithWait(10*time.Second))
		first <- got{l, err}
	}()
	waitFor(t, "the first waits", 5*time.Second, func() bool { return s.waiters("x") == 1 })
	go func() {
		l, err := c.LockKeys(bg, []string{"y", "x"}, WithWait(10*time.Second))
		second <- got{l, err}
	}()
	// Each request waits in the queue of every key it names.
	waitFor(t, "both wait", 5*time.Second, func() bool { return s.waiters("x") == 2 })
	if !s.free("y") {
		t.Fatal("y taken out of turn while both waited")
	}
	_ = blocker.Release(bg)
	a := <-first
	if a.err != nil {
		t.Fatal(a.err)
	}
	select {
	case b := <-second:
		t.Fatalf("both granted at once: %v", b)
	case <-time.After(200 * time.Millisecond):
	}
	_ = a.l.Release(bg)
	b := <-second
	if b.err != nil {
		t.Fatal(b.err)
	}
	_ = b.l.Release(bg)
}

func TestLockKeysIsLostWhenAnyKeyIsAndRenewsThemTogether(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	keys := []string{"k1", "k2", "k3"}
	l, err := c.TryLockKeys(bg, keys, WithTTL(1500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond)
	if !l.Held() {
		t.Fatalf("not held past its ttl: %v", l.Lost())
	}
	for _, k := range keys {
		if s.free(k) {
			t.Fatalf("%s expired: the watchdog did not renew it", k)
		}
	}
	s.rdb.Del(bg, "k2")
	select {
	case <-l.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("no loss after a key was deleted")
	}
	var lost *LostError
	if !errors.As(context.Cause(l.Context()), &lost) || lost.Reason != ReasonNotOwner {
		t.Fatalf("the loss: %v, want not-owner", context.Cause(l.Context()))
	}
}

func TestLockKeysCancelledWhileWaitingHoldsNothing(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	blocker, err := c.TryLock(bg, "k2")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	if _, err := c.LockKeys(ctx, []string{"k1", "k2"}); !errors.Is(err, ErrCancelled) {
		t.Fatalf("a cancelled wait: %v, want ErrCancelled", err)
	}
	waitFor(t, "the waiter leaves", 3*time.Second, func() bool { return s.waiters("k2") == 0 })
	_ = blocker.Release(bg)
	waitFor(t, "every key free", 3*time.Second, func() bool { return s.free("k1") && s.free("k2") })
	waitFor(t, "nothing running", 3*time.Second, func() bool { return c.Running() == 0 })
}
