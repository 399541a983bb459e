package redislock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redlock holds a lock on a majority of independent servers (an odd
// number, at least 3), each running the module. After a majority granted
// it, a LOCK.FENCE round raises the hold's fence on each of them to the
// highest they issued, so that fences rise from holder to holder across
// the quorum without any clock assumption. Renewals need a majority too;
// a release goes to every server (and is retried on those that did not
// answer). Ephemeral holds are refused: a hold bound to connections on
// several servers cannot end as one.
type Redlock struct {
	clients []*Client
	need    int
}

// NewRedlock makes a Redlock over one go-redis client per server.
func NewRedlock(rdbs ...redis.UniversalClient) (*Redlock, error) {
	cs := make([]*Client, len(rdbs))
	for i, r := range rdbs {
		cs[i] = New(r)
	}
	return NewRedlockOf(cs...)
}

// NewRedlockOf makes a Redlock over clients, one per independent server.
func NewRedlockOf(clients ...*Client) (*Redlock, error) {
	if len(clients) < 3 || len(clients)%2 == 0 {
		return nil, fmt.Errorf("%w: Redlock needs an odd number of at least 3 servers, not %d", ErrRefused, len(clients))
	}
	return &Redlock{clients: clients, need: len(clients)/2 + 1}, nil
}

// Running sums the background activities of the clients.
func (r *Redlock) Running() int {
	n := 0
	for _, c := range r.clients {
		n += c.Running()
	}
	return n
}

// Close closes every client's idle connections.
func (r *Redlock) Close() error {
	for _, c := range r.clients {
		c.Close()
	}
	return nil
}

// TryLock takes key on a majority now, or returns ErrNotObtained (having
// released whatever it got).
func (r *Redlock) TryLock(ctx context.Context, key string, opts ...Option) (*Lock, error) {
	return r.take(ctx, key, collect(opts), false)
}

// Lock takes key on a majority, trying again after a short random pause
// while it cannot, for as long as ctx allows (or WithWait says: then
// ErrTimedOut). A round never parks on a server: parked on different
// servers, competing holders could each wait for the others' majority.
func (r *Redlock) Lock(ctx context.Context, key string, opts ...Option) (*Lock, error) {
	return r.take(ctx, key, collect(opts), true)
}

func (r *Redlock) take(ctx context.Context, key string, o options, wait bool) (*Lock, error) {
	if o.ephemeral {
		return nil, fmt.Errorf("%w: a Redlock hold cannot be ephemeral (it spans several connections)", ErrRefused)
	}
	if _, err := ms(o.ttl, 1, "the lease"); err != nil {
		return nil, err
	}
	start := time.Now()
	pause := 5 * time.Millisecond
	for {
		// A new owner per round: a late release of the last round's
		// grants must not take this round's.
		l, err := r.round(ctx, key, newOwner(), o)
		if err == nil || !wait || !errors.Is(err, ErrNotObtained) {
			return l, err
		}
		if o.waitSet && time.Since(start) >= o.wait {
			return nil, ErrTimedOut
		}
		t := time.NewTimer(pause/2 + rand.N(pause))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, cancelled(ctx.Err())
		}
		pause = min(2*pause, 200*time.Millisecond)
	}
}

// round is one attempt: a try on every server at once, then, with a
// majority inside the lease's validity, the fence round.
func (r *Redlock) round(ctx context.Context, key, owner string, o options) (*Lock, error) {
	sent := time.Now()
	type grant struct {
		i     int
		fence int64
		err   error
	}
	// Each server gets at most a tenth of the lease: one that is paused
	// or unreachable must not eat the validity of the others' grants.
	per := min(max(o.ttl/10, 50*time.Millisecond), 2*time.Second)
	grants := make(chan grant, len(r.clients))
	for i, c := range r.clients {
		go func() {
			cctx, cancel := context.WithTimeout(ctx, per)
			defer cancel()
			l, err := c.acquire(cctx, key, owner, mode{}, options{ttl: o.ttl, noRenew: true}, false, nil)
			g := grant{i: i, err: err}
			if l != nil {
				g.fence = l.fence
				l.forget()
			}
			grants <- g
		}()
	}
	var got []int
	var top int64
	var firstErr error
	failed := 0
	for range r.clients {
		g := <-grants
		if g.err == nil {
			got = append(got, g.i)
			top = max(top, g.fence)
		} else if !errors.Is(g.err, ErrNotObtained) && !errors.Is(g.err, ErrCancelled) {
			failed++
			if firstErr == nil {
				firstErr = g.err
			}
		}
	}
	q := &quorum{clients: r.clients, need: r.need}
	valid := time.Until(deadline(sent, o.ttl))
	if len(got) >= r.need && valid > 0 {
		// The fence round: every granting server raises the hold's fence
		// to the highest any of them issued (and its own counter past it).
		fence := strconv.FormatInt(top, 10)
		res := q.each(ctx, got, "LOCK.FENCE", key, owner, fence)
		raised := 0
		for _, e := range res {
			if e.err == nil {
				raised++
			}
		}
		if raised >= r.need && time.Now().Before(deadline(sent, o.ttl)) {
			return r.clients[0].start(key, owner, top, o, sent, nil, q, nil, nil, nil), nil
		}
	}
	// No majority: give back what was granted (a grant still in flight on
	// a server that timed out was released by that call's clean-up).
	q.releaseEverywhere(key, owner, sent.Add(o.ttl))
	if ctx.Err() != nil {
		return nil, cancelled(ctx.Err())
	}
	// Some servers down is what Redlock is for: only when every server
	// failed is the failure the answer.
	if failed == len(r.clients) {
		return nil, firstErr
	}
	return nil, ErrNotObtained
}

// forget drops a hold's local bookkeeping without releasing it: a Redlock
// round takes over the grant of each server.
func (l *Lock) forget() {
	l.stopWatchdog(context.Background())
	l.mu.Lock()
	l.released = true
	l.mu.Unlock()
	l.cancel(errReleased)
}

// quorum runs a hold's commands on every server of a Redlock.
type quorum struct {
	clients []*Client
	need    int
}

type outcome struct {
	v   any
	err error
}

// each runs one command on the servers listed, at once, and returns each
// outcome.
func (q *quorum) each(ctx context.Context, which []int, args ...string) []outcome {
	out := make([]outcome, len(which))
	var wg sync.WaitGroup
	for j, i := range which {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := q.clients[i].exec(ctx, args[1], args...)
			out[j] = outcome{v, err}
		}()
	}
	wg.Wait()
	return out
}

// do is a renew's or release's majority: answered by a majority, it
// succeeded (at once: a paused server does not hold it up); refused
// (NOTOWNER) by so many that no majority can hold it, the hold is gone;
// anything else is a transport failure. A release goes to every server
// and is retried in the background on each that did not answer.
func (q *quorum) do(ctx context.Context, args ...string) (any, error) {
	release := args[0] == "LOCK.RELEASE"
	type result struct {
		i int
		outcome
	}
	results := make(chan result, len(q.clients))
	for i, c := range q.clients {
		go func() {
			t0 := time.Now()
			v, err := c.exec(ctx, args[1], args...)
			println("DBG", i, args[0], time.Since(t0).String(), fmt.Sprint(err))
			if err != nil && release {
				var se ServerError
				if !errors.As(err, &se) {
					c.releaseLater(args[1], args[2], len(args) > 3, nil, time.Now().Add(time.Hour))
				}
			}
			results <- result{i, outcome{v, err}}
		}()
	}
	ok, refused, answered := 0, 0, 0
	var v any
	var other error
	for answered < len(q.clients) {
		r := <-results
		answered++
		var se ServerError
		switch {
		case r.err == nil:
			ok++
			v = r.v
		case errors.As(r.err, &se) && errors.Is(mapServerError(se), ErrNotOwner):
			refused++
		default:
			other = r.err
		}
		if !release && ok >= q.need {
			return v, nil
		}
		if refused > len(q.clients)-q.need {
			return nil, ServerError("NOTOWNER no majority of the servers holds the lock for this owner")
		}
	}
	if ok >= q.need || (release && ok > 0) {
		return v, nil
	}
	if other == nil {
		other = errors.New("no majority answered")
	}
	return nil, transportError(other)
}

func (q *quorum) releaseLater(key, owner string, all bool, until time.Time) {
	for _, c := range q.clients {
		c.releaseLater(key, owner, all, nil, until)
	}
}

func (q *quorum) releaseEverywhere(key, owner string, until time.Time) {
	q.releaseLater(key, owner, false, until)
}
