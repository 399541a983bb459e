package redislock

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cancellation at any point leaves nothing held and nothing running: after
// each cancel the server lists no hold of the cancelled owner, the client
// counts no background activity, and once the client is closed the
// process has no more goroutines than before it.

func goroutinesBackTo(t *testing.T, baseline int) {
	t.Helper()
	end := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > baseline {
		if time.Now().After(end) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), baseline, buf[:n])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestCancelBeforeTheSendSendsNothing(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	ctx, cancel := context.WithCancel(bg)
	cancel()
	for _, try := range []bool{true, false} {
		var err error
		if try {
			_, err = c.TryLock(ctx, "k")
		} else {
			_, err = c.Lock(ctx, "k")
		}
		if !errors.Is(err, ErrCancelled) || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled before the send: %v", err)
		}
	}
	if s.owners(t, "k") != nil || c.Running() != 0 {
		t.Fatal("a call cancelled before its send left something")
	}
}

func TestCancelWhileParkedLeavesNothingHeldOrRunning(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	s.owners(t, "k") // the test's own connection is up: its goroutines count in the baseline
	baseline := runtime.NumGoroutine()
	holder, err := c.Lock(bg, "k")
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]func(ctx context.Context) (*Lock, error){
		"lock":      func(ctx context.Context) (*Lock, error) { return c.Lock(ctx, "k") },
		"read":      func(ctx context.Context) (*Lock, error) { return c.RWMutex("k").RLock(ctx) },
		"write":     func(ctx context.Context) (*Lock, error) { return c.RWMutex("k").Lock(ctx) },
		"permit":    func(ctx context.Context) (*Lock, error) { return c.Semaphore("k", 3).Acquire(ctx) },
		"ephemeral": func(ctx context.Context) (*Lock, error) { return c.Lock(ctx, "k", Ephemeral()) },
	}
	for name, take := range kinds {
		ctx, cancel := context.WithCancel(bg)
		done := make(chan error, 1)
		go func() {
			_, err := take(ctx)
			done <- err
		}()
		waitFor(t, name+" parks", 5*time.Second, func() bool { return s.waiters("k") == 1 })
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, ErrCancelled) {
				t.Fatalf("%s: %v, want ErrCancelled", name, err)
			}
		case <-time.After(time.Second):
			t.Fatalf("%s: the cancel did not return at once", name)
		}
		waitFor(t, name+": the waiter leaves the queue", 2*time.Second, func() bool { return s.waiters("k") == 0 })
	}
	if err := holder.Release(bg); err != nil {
		t.Fatal(err)
	}
	if s.owners(t, "k") != nil {
		t.Fatalf("held after every cancel and the release: %v", s.owners(t, "k"))
	}
	waitFor(t, "no background activity", 2*time.Second, func() bool { return c.Running() == 0 })
	c.Close()
	goroutinesBackTo(t, baseline)
}

// A cancel racing the grant: the holder releases at about the moment the
// waiter's context is cancelled. Whichever wins, the waiter either holds
// (and releases) or holds nothing on the server afterwards.
func TestCancelRacingTheGrantNeverLeavesAHold(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	s.owners(t, "k") // the test's own connection is up: its goroutines count in the baseline
	baseline := runtime.NumGoroutine()
	for i := range 30 {
		holder, err := c.Lock(bg, "k")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg)
		type result struct {
			l   *Lock
			err error
		}
		done := make(chan result, 1)
		go func() {
			l, err := c.Lock(ctx, "k")
			done <- result{l, err}
		}()
		waitFor(t, "the waiter parks", 5*time.Second, func() bool { return s.waiters("k") == 1 })
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); _ = holder.Release(bg) }()
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
			cancel()
		}()
		wg.Wait()
		r := <-done
		if r.err == nil {
			if err := r.l.Release(bg); err != nil {
				t.Fatalf("round %d: release of the won lock: %v", i, err)
			}
		} else if !errors.Is(r.err, ErrCancelled) {
			t.Fatalf("round %d: %v", i, r.err)
		}
		waitFor(t, "nothing held", 2*time.Second, func() bool { return s.owners(t, "k") == nil })
	}
	waitFor(t, "no background activity", 2*time.Second, func() bool { return c.Running() == 0 })
	c.Close()
	goroutinesBackTo(t, baseline)
}

// A try sent to a server that pauses writes has no reply; cancelled, it
// returns at once, and the grant that comes at the pause's end is released
// on the same connection.
func TestCancelWhileTheReplyIsInFlightReleasesTheGrant(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	s.pauseWrites(t, 400*time.Millisecond)
	ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.TryLock(ctx, "k")
	if !errors.Is(err, ErrCancelled) {
		t.Fatalf("try on a paused server: %v, want ErrCancelled", err)
	}
	if d := time.Since(start); d > 300*time.Millisecond {
		t.Fatalf("the cancel returned after %v", d)
	}
	// After the pause the try is granted, then released right behind it.
	waitFor(t, "no background activity", 3*time.Second, func() bool { return c.Running() == 0 })
	if s.owners(t, "k") != nil {
		t.Fatal("the grant that crossed the cancel is still held")
	}
	acquired, _ := s.rdb.Do(bg, "INFO", "lock").Text()
	if !contains(acquired, "lock_acquired:1") {
		t.Fatalf("the try should have been granted after the pause (then released):\n%s", acquired)
	}
}

// The confirming renew (a wait longer than a third of the lease) cancelled:
// the grant is released.
func TestCancelDuringTheConfirmingRenewReleasesTheGrant(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	if err := s.rdb.Do(bg, "LOCK.ACQUIRE", "k", "holder", "30000").Err(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() {
		_, err := c.Lock(ctx, "k", WithTTL(300*time.Millisecond))
		done <- err
	}()
	waitFor(t, "the waiter parks", 5*time.Second, func() bool { return s.waiters("k") == 1 })
	time.Sleep(150 * time.Millisecond) // past a third of the waiter's lease
	// The release hands the lock over inside its own command; the pause
	// sent right behind it on the same connection then holds the waiter's
	// confirming renew (a write).
	pipe := s.rdb.Pipeline()
	pipe.Do(bg, "LOCK.RELEASE", "k", "holder")
	pipe.Do(bg, "CLIENT", "PAUSE", "300", "WRITE")
	if _, err := pipe.Exec(bg); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)
	cancel()
	if err := <-done; !errors.Is(err, ErrCancelled) {
		t.Fatalf("%v, want ErrCancelled", err)
	}
	waitFor(t, "no background activity", 3*time.Second, func() bool { return c.Running() == 0 })
	if s.owners(t, "k") != nil {
		t.Fatal("the grant is still held after its confirming renew was cancelled")
	}
}

func TestReleaseThatDoesNotCompleteReportsLostAndIsRetried(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	l, err := c.Lock(bg, "k", WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s.pauseWrites(t, 500*time.Millisecond)
	ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	err = l.Release(ctx)
	var le *LostError
	if !errors.As(err, &le) || le.Reason != ReasonReleaseUnconfirmed {
		t.Fatalf("release on a paused server: %v, want lost (release-unconfirmed)", err)
	}
	if l.Held() || !errors.Is(context.Cause(l.Context()), ErrLost) {
		t.Fatal("the handle still reports the lock held")
	}
	waitFor(t, "the background release lands", 3*time.Second, func() bool { return s.owners(t, "k") == nil })
	waitFor(t, "no background activity", 3*time.Second, func() bool { return c.Running() == 0 })
}

func contains(s, sub string) bool {
	return len(s) >= len(sub) && (s == sub || len(sub) == 0 || indexOf(s, sub) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// A wait sent while writes are paused is not parked in the lock's queue
// yet (the server postponed it): the cancel must not CLIENT UNBLOCK it
// then (Redis 7.0 crashes on an UNBLOCK of a postponed client), and the
// grant that comes at the pause's end is released.
func TestCancelOfAWaitPostponedByAPauseReleasesTheGrant(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	s.pauseWrites(t, 500*time.Millisecond)
	ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
	defer cancel()
	if _, err := c.Lock(ctx, "k", WithWait(10*time.Second)); !errors.Is(err, ErrCancelled) {
		t.Fatalf("a wait on a paused server: %v, want ErrCancelled", err)
	}
	waitFor(t, "no background activity", 3*time.Second, func() bool { return c.Running() == 0 })
	if err := s.rdb.Ping(bg).Err(); err != nil {
		t.Fatalf("the server is gone: %v", err)
	}
	if s.owners(t, "k") != nil {
		t.Fatal("the grant that came after the pause is still held")
	}
}

// A try whose reply does not come within its own lease is useless when it
// comes: the call gives up at the lease's deadline as a cancel, and the
// grant, if any, is released once the server answers.
func TestATryWhoseReplyComesPastItsLeaseCountsAsCancelled(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	// A connection already open, so that the try is sent while the
	// server sleeps (not the connection's set-up).
	warm, err := c.TryLock(bg, "warm")
	if err != nil {
		t.Fatal(err)
	}
	_ = warm.Release(bg)
	sleeper := redis.NewClient(&redis.Options{Addr: s.addr})
	defer sleeper.Close()
	go sleeper.Do(bg, "DEBUG", "SLEEP", "1")
	time.Sleep(100 * time.Millisecond) // the server sleeps now
	start := time.Now()
	_, err = c.TryLock(bg, "k", WithTTL(300*time.Millisecond))
	if !errors.Is(err, ErrCancelled) {
		t.Fatalf("a try answered after its lease: %v, want ErrCancelled", err)
	}
	if d := time.Since(start); d > 700*time.Millisecond {
		t.Fatalf("gave up after %v, not at the lease's deadline", d)
	}
	waitFor(t, "no background activity", 3*time.Second, func() bool { return c.Running() == 0 })
	if s.owners(t, "k") != nil {
		t.Fatal("the late grant is still held")
	}
}
