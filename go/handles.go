package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Handle is a lock object with one owner token: every hold taken through
// it is the same owner's, so taking it again while it holds reenters
// (count + 1, the same fence), and each *Lock it returns is one count to
// release. Goroutines that must exclude each other use a Handle each (or
// Client.Lock, which takes a new owner per call).
type Handle struct {
	c     *Client
	key   string
	owner string
	bt    bindingTable
}

// Handle returns a new lock object for key with an owner of its own.
func (c *Client) Handle(key string) *Handle { return &Handle{c: c, key: key, owner: newOwner()} }

// Owner is the handle's owner token.
func (h *Handle) Owner() string { return h.owner }

// Lock takes (or reenters) the lock, waiting as long as ctx allows.
func (h *Handle) Lock(ctx context.Context, opts ...Option) (*Lock, error) {
	return h.c.acquire(ctx, h.key, h.owner, mode{}, collect(opts), true, &h.bt)
}

// TryLock takes (or reenters) the lock if it can now: ErrNotObtained else.
func (h *Handle) TryLock(ctx context.Context, opts ...Option) (*Lock, error) {
	return h.c.acquire(ctx, h.key, h.owner, mode{}, collect(opts), false, &h.bt)
}

// RWMutex is a read-write lock object with one owner for both sides: its
// writer may take the read side (a reentry of the write hold), and while
// it holds only the read side a request for the write side is refused at
// once with ErrUpgrade (two readers upgrading would wait on each other for
// ever). One queue serves both sides first come first served: a waiting
// writer is not starved by readers arriving after it.
type RWMutex struct {
	c     *Client
	key   string
	owner string

	mu     sync.Mutex
	reads  int
	writes int
	bt     bindingTable
}

// RWMutex returns a new read-write lock object for key.
func (c *Client) RWMutex(key string) *RWMutex {
	return &RWMutex{c: c, key: key, owner: newOwner()}
}

// Owner is the owner token both sides are held under.
func (rw *RWMutex) Owner() string { return rw.owner }

// Lock takes the write side, waiting as long as ctx allows.
func (rw *RWMutex) Lock(ctx context.Context, opts ...Option) (*Lock, error) {
	return rw.take(ctx, false, true, opts)
}

// TryLock takes the write side if it can now.
func (rw *RWMutex) TryLock(ctx context.Context, opts ...Option) (*Lock, error) {
	return rw.take(ctx, false, false, opts)
}

// RLock takes the read side, waiting as long as ctx allows.
func (rw *RWMutex) RLock(ctx context.Context, opts ...Option) (*Lock, error) {
	return rw.take(ctx, true, true, opts)
}

// TryRLock takes the read side if it can now.
func (rw *RWMutex) TryRLock(ctx context.Context, opts ...Option) (*Lock, error) {
	return rw.take(ctx, true, false, opts)
}

func (rw *RWMutex) take(ctx context.Context, read, wait bool, opts []Option) (*Lock, error) {
	rw.mu.Lock()
	if !read && rw.reads > 0 && rw.writes == 0 {
		rw.mu.Unlock()
		return nil, ErrUpgrade
	}
	rw.mu.Unlock()
	l, err := rw.c.acquire(ctx, rw.key, rw.owner, mode{shared: read}, collect(opts), wait, &rw.bt)
	if err != nil {
		return nil, err
	}
	rw.mu.Lock()
	if read {
		rw.reads++
	} else {
		rw.writes++
	}
	rw.mu.Unlock()
	l.setOnEnd(func() {
		rw.mu.Lock()
		if read {
			rw.reads--
		} else {
			rw.writes--
		}
		rw.mu.Unlock()
	})
	return l, nil
}

// Semaphore hands out leased permits of a counting semaphore: at most
// limit holds share the key at once. Each Acquire takes a permit under an
// owner of its own, so goroutines of one process take distinct permits.
type Semaphore struct {
	c     *Client
	key   string
	limit int
}

// Semaphore returns the semaphore at key with limit permits (1 to
// 1,000,000). Every holder must use the same limit: ErrLimitMismatch else.
func (c *Client) Semaphore(key string, limit int) *Semaphore {
	return &Semaphore{c: c, key: key, limit: limit}
}

// Acquire takes a permit (WithPermits(k): k of them as one hold), waiting
// as long as ctx allows.
func (s *Semaphore) Acquire(ctx context.Context, opts ...Option) (*Lock, error) {
	return s.take(ctx, newOwner(), true, opts)
}

// TryAcquire takes a permit if one is free now.
func (s *Semaphore) TryAcquire(ctx context.Context, opts ...Option) (*Lock, error) {
	return s.take(ctx, newOwner(), false, opts)
}

func (s *Semaphore) take(ctx context.Context, owner string, wait bool, opts []Option) (*Lock, error) {
	if s.limit < 1 || s.limit > 1_000_000 {
		return nil, fmt.Errorf("%w: a semaphore's limit must be from 1 to 1000000, not %d", ErrRefused, s.limit)
	}
	o := collect(opts)
	if o.permits < 0 || o.permits > s.limit {
		return nil, fmt.Errorf("%w: permits must be from 1 to the limit %d, not %d", ErrRefused, s.limit, o.permits)
	}
	return s.c.acquire(ctx, s.key, owner, mode{shared: true, limit: s.limit, permits: o.permits}, o, wait, nil)
}

// Resume continues a hold another process took, from its owner token: a
// renew confirms it (ErrNotOwner if it is no longer held), then it is watched and renewed like one taken here. fence is
// what the taker read (0: read it from the server).
func (c *Client) Resume(ctx context.Context, key, owner string, fence int64, opts ...Option) (*Lock, error) {
	o := collect(opts)
	arg, err := ms(o.ttl, 1, "the lease")
	if err != nil {
		return nil, err
	}
	if o.ephemeral {
		return nil, fmt.Errorf("%w: an ephemeral hold stays bound to the connection that took it", ErrRefused)
	}
	sent := time.Now()
	if _, err := c.exec(ctx, key, "LOCK.RENEW", key, owner, arg); err != nil {
		var se ServerError
		if errors.As(err, &se) {
			return nil, mapServerError(se)
		}
		return nil, err
	}
	if fence == 0 {
		fence = c.fenceOf(ctx, key, owner)
	}
	return c.start(key, owner, fence, o, sent, nil, nil, nil, nil, nil), nil
}

// fenceOf reads owner's fence from LOCK.INFO (its holders list), 0 if
// it cannot.
func (c *Client) fenceOf(ctx context.Context, key, owner string) int64 {
	v, err := c.exec(ctx, key, "LOCK.INFO", key)
	if err != nil {
		return 0
	}
	fields, _ := v.([]any)
	for i := 0; i+1 < len(fields); i += 2 {
		if name, _ := fields[i].(string); name == "holders" {
			holders, _ := fields[i+1].([]any)
			for _, h := range holders {
				hf, _ := h.([]any)
				var who string
				var fence int64
				for j := 0; j+1 < len(hf); j += 2 {
					switch hf[j] {
					case "owner":
						who, _ = hf[j+1].(string)
					case "fence":
						fence, _ = hf[j+1].(int64)
					}
				}
				if who == owner {
					return fence
				}
			}
		}
	}
	return 0
}

func (l *Lock) setOnEnd(f func()) {
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		f()
		return
	}
	l.onEnd = f
	l.mu.Unlock()
}

// Locker adapts the lock at key to sync.Locker for code that takes one:
// Lock waits (retrying transport errors) until it holds it under a new
// owner, Unlock releases that hold. Errors have nowhere to go in that
// interface: onError, when not nil, receives them (a release that did not
// complete, a lock lost before Unlock).
func (c *Client) Locker(key string, onError func(error), opts ...Option) sync.Locker {
	return &locker{c: c, key: key, onError: onError, opts: opts}
}

type locker struct {
	c       *Client
	key     string
	onError func(error)
	opts    []Option
	mu      sync.Mutex
	held    *Lock
}

func (k *locker) Lock() {
	delay := 10 * time.Millisecond
	for {
		l, err := k.c.Lock(context.Background(), k.key, k.opts...)
		if err == nil {
			k.mu.Lock()
			k.held = l
			k.mu.Unlock()
			return
		}
		k.report(err)
		time.Sleep(delay)
		delay = min(2*delay, time.Second)
	}
}

func (k *locker) Unlock() {
	k.mu.Lock()
	l := k.held
	k.held = nil
	k.mu.Unlock()
	if l == nil {
		panic("redislock: Unlock of an unlocked Locker")
	}
	if err := l.Release(context.Background()); err != nil {
		k.report(err)
	}
}

func (k *locker) report(err error) {
	if k.onError != nil {
		k.onError(err)
	}
}
