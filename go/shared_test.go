package redislock

import (
	"errors"
	"testing"
	"time"
)

func TestRWMutexWriterMayReadAndReaderCannotUpgrade(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	rw := c.RWMutex("cfg")
	w, err := rw.Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := rw.TryRLock(bg)
	if err != nil {
		t.Fatalf("the writer taking the read side: %v", err)
	}
	if r.Fence() != w.Fence() {
		t.Fatalf("a reentry's fence %d differs from %d", r.Fence(), w.Fence())
	}
	if _, err := c.RWMutex("cfg").TryRLock(bg); !errors.Is(err, ErrNotObtained) {
		t.Fatalf("another reader while written: %v", err)
	}
	if err := w.Release(bg); err != nil {
		t.Fatal(err)
	}
	if err := r.Release(bg); err != nil {
		t.Fatal(err)
	}

	reader := c.RWMutex("cfg")
	r1, err := reader.RLock(bg)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.RWMutex("cfg").RLock(bg)
	if err != nil {
		t.Fatalf("two readers at once: %v", err)
	}
	start := time.Now()
	if _, err := reader.Lock(bg); !errors.Is(err, ErrUpgrade) {
		t.Fatalf("a reader asking to write: %v, want ErrUpgrade", err)
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("the upgrade was refused after %v, not at once", d)
	}
	// The server refuses it too, for a handle that does not know it reads.
	other := &RWMutex{c: c, key: "cfg", owner: reader.Owner()}
	if _, err := other.TryLock(bg); !errors.Is(err, ErrUpgrade) {
		t.Fatalf("the server's upgrade refusal: %v, want ErrUpgrade", err)
	}
	// A writer waits for both readers.
	got := make(chan error, 1)
	go func() {
		w, err := c.RWMutex("cfg").Lock(bg)
		if err == nil {
			err = w.Release(bg)
		}
		got <- err
	}()
	waitFor(t, "the writer waits", 5*time.Second, func() bool { return s.waiters("cfg") == 1 })
	_ = r1.Release(bg)
	select {
	case <-got:
		t.Fatal("the writer got in with a reader still holding")
	case <-time.After(100 * time.Millisecond):
	}
	_ = r2.Release(bg)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

func TestSemaphoreLeasesAtMostLimitPermits(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	sem := c.Semaphore("pool", 2)
	p1, err := sem.TryAcquire(bg)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := sem.TryAcquire(bg, WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sem.TryAcquire(bg); !errors.Is(err, ErrNotObtained) {
		t.Fatalf("a third permit of two: %v", err)
	}
	if _, err := c.Semaphore("pool", 3).TryAcquire(bg); !errors.Is(err, ErrLimitMismatch) {
		t.Fatalf("another limit: %v, want ErrLimitMismatch", err)
	}
	got := make(chan *Lock, 1)
	go func() {
		p, err := sem.Acquire(bg)
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	waitFor(t, "the third waits", 5*time.Second, func() bool { return s.waiters("pool") == 1 })
	_ = p2.Release(bg)
	p3 := <-got
	if p3 == nil {
		t.FailNow()
	}
	if n := len(s.owners(t, "pool")); n != 2 {
		t.Fatalf("%d holders, want 2", n)
	}
	_ = p1.Release(bg)
	_ = p3.Release(bg)
}

func TestSemaphorePermitsTakenAsOneHold(t *testing.T) {
	s := startServer(t)
	c := s.client(t)
	if err := s.rdb.Do(bg, "LOCK.ACQUIRE", "probe", "o", "1000", "SHARED", "LIMIT", "2", "PERMITS", "1").Err(); err != nil {
		t.Skipf("this module has no PERMITS: %v", err)
	}
	sem := c.Semaphore("pool", 2)
	if _, err := sem.TryAcquire(bg, WithPermits(3)); !errors.Is(err, ErrRefused) {
		t.Fatalf("3 permits of 2: %v, want ErrRefused", err)
	}
	both, err := sem.TryAcquire(bg, WithPermits(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sem.TryAcquire(bg); !errors.Is(err, ErrNotObtained) {
		t.Fatalf("a permit while one hold has both: %v", err)
	}
	_ = both.Release(bg)
}
