package redislock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// errReleased is the cause of a lock's Context once it was released.
var errReleased = errors.New("redislock: released")

// Lock is one hold of a lock. Send Fence() with every write to the guarded
// resource, do the work under Context(), and Release it at the end.
//
// A watchdog renews the lease every third of it (unless WithoutWatchdog);
// when the local deadline (the send time of the last confirmed acquire or
// renew + ttl - Drift(ttl)) passes without a renew, or the server says this
// owner lost it, the hold is lost: Context() is cancelled at that moment
// with a *LostError as its cause, and stays so.
type Lock struct {
	c     *Client
	key   string
	owner string
	fence int64
	// keys and fences, for a hold on several keys at once (LockKeys):
	// every key and its fence, in order; its commands name them all.
	keys   []string
	fences []int64
	ctx    context.Context
	cancel context.CancelCauseFunc
	// bound is an ephemeral hold's own connection, open for the hold's life.
	bound *link
	// binding, when set, shares bound with the owner object's other holds
	// on the key (reentries): it closes with the last of them.
	binding *binding
	// onEnd, when set, runs once when the hold ends (released or lost).
	onEnd func()
	// quorum, for a Redlock hold, runs its commands on every server.
	quorum *quorum
	// unbindWatch stops the watch on bound.
	unbindWatch func()

	mu       sync.Mutex
	ttl      time.Duration
	deadline time.Time
	lost     *LostError
	released bool
	renew    bool
	dog      *watchdog
	ended    bool
	// renewed is the send time of the last confirmed renew.
	renewed time.Time
	// expiry raises the loss at the deadline by itself, in one step from
	// the timer (the watchdog may be busy in a renew then).
	expiry *time.Timer
}

// watchdog is a running watchdog goroutine: close stop to end it, then
// wait for done. moved wakes it after a manual renew.
type watchdog struct {
	stop  chan struct{}
	done  chan struct{}
	moved chan struct{}
}

// start begins watching a hold; keys and fences are set for a hold on
// several keys (before the watchdog starts: its renewals name them all).
func (c *Client) start(key, owner string, fence int64, o options, sent time.Time, bound *link, q *quorum, b *binding, keys []string, fences []int64) *Lock {
	ctx, cancel := context.WithCancelCause(context.Background())
	l := &Lock{
		c: c, key: key, owner: owner, fence: fence, keys: keys, fences: fences, ctx: ctx, cancel: cancel,
		bound: bound, ttl: o.ttl, deadline: deadline(sent, o.ttl), renew: !o.noRenew,
		renewed: sent, quorum: q, binding: b,
	}
	if bound != nil {
		// The server ends the hold when this connection closes; say so at
		// once rather than at the next renewal.
		stop := make(chan struct{})
		l.unbindWatch = sync.OnceFunc(func() { close(stop) })
		c.spawn(func() {
			select {
			case <-bound.closed:
				l.lose(ReasonDisconnected)
			case <-stop:
			}
		})
	}
	l.mu.Lock()
	l.expiry = time.AfterFunc(time.Until(l.deadline), l.checkDeadline)
	l.startWatchdog()
	l.mu.Unlock()
	return l
}

// Key is the lock's key (the first, for a lock on several keys).
func (l *Lock) Key() string { return l.key }

// Keys are the keys the lock holds: its key, or for a lock on several
// keys (LockKeys) every one, in the order asked for.
func (l *Lock) Keys() []string {
	if l.keys == nil {
		return []string{l.key}
	}
	return slices.Clone(l.keys)
}

// Fences has one fence per key of Keys, in order (Fence is the highest).
func (l *Lock) Fences() []int64 {
	if l.fences == nil {
		return []int64{l.fence}
	}
	return slices.Clone(l.fences)
}

// mode: what the hold's renewals and releases name (its keys).
func (l *Lock) mode() mode { return mode{keys: l.keys} }

// Owner is the token the hold is taken under: pass it (with the fence) to
// another process to continue the hold there (Client.Resume).
func (l *Lock) Owner() string { return l.owner }

// Fence is the fencing token: a resource that refuses writes with a fence
// lower than the highest it has seen is safe against stale holders.
func (l *Lock) Fence() int64 { return l.fence }

// Context is cancelled the moment the hold is lost (its cause is then a
// *LostError) or released. Do the work under the lock with it.
func (l *Lock) Context() context.Context { return l.ctx }

// Deadline is until when the lease is surely valid here.
func (l *Lock) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Lost returns the *LostError once the hold is lost, nil before. It reads
// the clock itself, so a deadline passed is reported even if no goroutine
// has run since.
func (l *Lock) Lost() error {
	l.checkDeadline()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost == nil {
		return nil
	}
	return l.lost
}

// Held says whether this hold is still held: not released, not lost.
func (l *Lock) Held() bool {
	l.checkDeadline()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost == nil && !l.released
}

func (l *Lock) checkDeadline() {
	l.mu.Lock()
	passed := l.lost == nil && !l.released && !time.Now().Before(l.deadline)
	l.mu.Unlock()
	if passed {
		l.lose(ReasonExpired)
	}
}

// lose raises the loss signal (once; nothing clears it) before anything
// else is done about it.
func (l *Lock) lose(why LossReason) {
	l.mu.Lock()
	if l.lost != nil || l.released {
		l.mu.Unlock()
		return
	}
	l.lost = &LostError{Reason: why}
	err := l.lost
	d := l.dog
	l.dog = nil
	l.mu.Unlock()
	l.cancel(err)
	// Then the rest: the watchdog stops renewing (not awaited: this may be
	// the watchdog itself), and an ephemeral hold's connection closes.
	if d != nil {
		close(d.stop)
	}
	if why != ReasonReleaseUnconfirmed {
		l.unbind()
	}
	l.end()
}

// end runs once the hold is over: the watch on an ephemeral connection
// stops, and the owner object forgets the hold.
func (l *Lock) end() {
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		return
	}
	l.ended = true
	if l.expiry != nil {
		l.expiry.Stop()
	}
	l.mu.Unlock()
	if l.onEnd != nil {
		l.onEnd()
	}
}

// Renew renews the lease now, for the same ttl (the watchdog does it on
// its own).
func (l *Lock) Renew(ctx context.Context) error {
	l.mu.Lock()
	ttl := l.ttl
	l.mu.Unlock()
	return l.RenewFor(ctx, ttl)
}

// RenewFor makes the lease ttl from now; later renewals use ttl too.
func (l *Lock) RenewFor(ctx context.Context, ttl time.Duration) error {
	arg, err := ms(ttl, 1, "the lease")
	if err != nil {
		return err
	}
	if err := l.usable(); err != nil {
		return err
	}
	sent := time.Now()
	_, err = l.do(ctx, l.mode().renewArgs(l.key, l.owner, arg)...)
	if err != nil {
		return l.failed(err)
	}
	l.extend(sent, ttl)
	return nil
}

// usable: the error of a hold that can no longer be acted on.
func (l *Lock) usable() error {
	l.checkDeadline()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != nil {
		return l.lost
	}
	if l.released {
		return ErrNotOwner
	}
	return nil
}

// failed turns a renew's or release's error into the hold's: NOTOWNER (or
// another type over the key) is a loss.
func (l *Lock) failed(err error) error {
	var se ServerError
	if errors.As(err, &se) {
		mapped := mapServerError(se)
		if errors.Is(mapped, ErrNotOwner) {
			l.lose(ReasonNotOwner)
			return l.Lost()
		}
		return mapped
	}
	return err
}

// do runs a command of this hold: on its own connection when ephemeral
// (it needs no pooled one), else on a lent one.
func (l *Lock) do(ctx context.Context, args ...string) (any, error) {
	if l.quorum != nil {
		return l.quorum.do(ctx, args...)
	}
	l.mu.Lock()
	bound := l.bound
	l.mu.Unlock()
	if bound != nil {
		return bound.do(ctx, args...)
	}
	return l.c.exec(ctx, l.key, args...)
}

// extend: a renew sent at sent was confirmed for ttl.
func (l *Lock) extend(sent time.Time, ttl time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != nil || l.released {
		return
	}
	// Renews can overlap (the watchdog's and a manual one): keep the later
	// deadline, unless the lease itself changed (a shorter one ends sooner).
	if d := deadline(sent, ttl); d.After(l.deadline) || ttl != l.ttl {
		l.deadline = d
		if l.expiry != nil {
			l.expiry.Reset(time.Until(d))
		}
	}
	l.ttl = ttl
	l.renewed = sent
	if l.dog != nil {
		select {
		case l.dog.moved <- struct{}{}:
		default:
		}
	}
}

// StopRenewing stops the watchdog (a renew in flight is awaited) without
// releasing: the hold stays until its lease ends, and its loss still fires
// at the deadline.
func (l *Lock) StopRenewing() {
	l.stopWatchdog(context.Background())
	l.mu.Lock()
	defer l.mu.Unlock()
	l.renew = false
	if l.lost == nil && !l.released {
		l.startWatchdog()
	}
}

// Release ends this hold (one count of a reentered one). The watchdog is
// stopped and awaited first, so no renew follows the release. A release
// that does not complete (ctx ended, transport error) leaves the hold
// reported lost (ReasonReleaseUnconfirmed) and is retried in the
// background until it lands or the lease ends.
func (l *Lock) Release(ctx context.Context) error { return l.release(ctx, false) }

// ReleaseAll ends every hold of this owner on the lock, whatever its count
// (reentries through the same Handle or RWMutex included).
func (l *Lock) ReleaseAll(ctx context.Context) error { return l.release(ctx, true) }

func (l *Lock) release(ctx context.Context, all bool) error {
	if err := l.usable(); err != nil {
		l.stopWatchdog(ctx)
		l.unbind()
		// A Redlock hold lost for want of a majority may still be held on
		// a minority of its servers: free them rather than wait for the
		// lease.
		if l.quorum != nil && errors.Is(err, ErrLost) {
			l.mu.Lock()
			until := l.deadline.Add(Drift(l.ttl))
			l.mu.Unlock()
			l.quorum.releaseLater(l.key, l.owner, all, until)
		}
		return err
	}
	if !l.stopWatchdog(ctx) {
		return l.unconfirmed(cancelled(ctx.Err()), all)
	}
	if err := l.usable(); err != nil {
		l.unbind()
		return err
	}
	_, err := l.do(ctx, l.mode().releaseArgs(l.key, l.owner, all)...)
	if err == nil {
		l.mu.Lock()
		l.released = true
		l.mu.Unlock()
		l.cancel(errReleased)
		l.unbind()
		l.end()
		return nil
	}
	var se ServerError
	if errors.As(err, &se) {
		err = l.failed(err)
		l.unbind()
		return err
	}
	return l.unconfirmed(err, all)
}

// unconfirmed: a release that did not complete. The hold is reported lost
// first, then the release is retried in the background.
func (l *Lock) unconfirmed(cause error, all bool) error {
	l.lose(ReasonReleaseUnconfirmed)
	l.mu.Lock()
	until := l.deadline.Add(Drift(l.ttl))
	bound, b := l.bound, l.binding
	l.bound, l.binding = nil, nil
	l.mu.Unlock()
	if l.unbindWatch != nil {
		l.unbindWatch()
	}
	if b != nil && bound != nil && !b.done() {
		// Other holds of the owner still need the connection open: retry
		// over pooled connections (the owner's commands work from any).
		bound = nil
	}
	if l.quorum != nil {
		l.quorum.releaseLater(l.key, l.owner, all, until)
	} else {
		l.c.releaseCmdLater(l.key, l.mode().releaseArgs(l.key, l.owner, all), bound, until)
	}
	err := l.Lost()
	if cause != nil {
		return errors.Join(err, cause)
	}
	return err
}

// unbind closes an ephemeral hold's connection once the hold is over.
func (l *Lock) unbind() {
	l.mu.Lock()
	bound, b := l.bound, l.binding
	l.bound, l.binding = nil, nil
	l.mu.Unlock()
	if bound == nil {
		return
	}
	if l.unbindWatch != nil {
		l.unbindWatch()
	}
	if b != nil && !b.done() {
		return // another hold of the owner keeps the connection open
	}
	l.c.dropLink(bound)
}

// startWatchdog starts the goroutine that renews (while renew is on) and
// raises the loss at the deadline. l.mu is held.
func (l *Lock) startWatchdog() {
	d := &watchdog{stop: make(chan struct{}), done: make(chan struct{}), moved: make(chan struct{}, 1)}
	l.dog = d
	renew := l.renew
	l.c.spawn(func() {
		defer close(d.done)
		l.watch(d, renew)
	})
}

// stopWatchdog stops the watchdog and waits for it (a renew in flight
// included) until ctx ends: false then.
func (l *Lock) stopWatchdog(ctx context.Context) bool {
	l.mu.Lock()
	d := l.dog
	l.dog = nil
	l.mu.Unlock()
	if d == nil {
		return true
	}
	close(d.stop)
	select {
	case <-d.done:
		return true
	case <-ctx.Done():
		return false
	}
}

func (l *Lock) watch(d *watchdog, renew bool) {
	l.mu.Lock()
	next := l.renewed.Add(renewPeriod(l.ttl))
	l.mu.Unlock()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		l.mu.Lock()
		dl, ttl := l.deadline, l.ttl
		l.mu.Unlock()
		wake := dl
		if renew && next.Before(dl) {
			wake = next
		}
		timer.Reset(time.Until(wake))
		select {
		case <-d.stop:
			return
		case <-d.moved:
			// A manual renew, perhaps for another ttl: the next renewal
			// is a third of that ttl after it.
			l.mu.Lock()
			next = l.renewed.Add(renewPeriod(l.ttl))
			l.mu.Unlock()
			continue
		case <-timer.C:
		}
		if !time.Now().Before(dl) {
			l.lose(ReasonExpired)
			return
		}
		if !renew || time.Now().Before(next) {
			continue
		}
		arg, err := ms(ttl, 1, "the lease")
		if err != nil {
			return
		}
		// The renew may take until the deadline, not longer: the loss
		// must never come late. A stop waits for it (no renew follows a
		// release).
		ctx, cancel := context.WithDeadline(context.Background(), dl)
		sent := time.Now()
		_, err = l.do(ctx, l.mode().renewArgs(l.key, l.owner, arg)...)
		cancel()
		var se ServerError
		switch {
		case err == nil:
			l.extend(sent, ttl)
			next = sent.Add(renewPeriod(ttl))
		case errors.As(err, &se):
			if errors.Is(l.failed(err), ErrLost) {
				return
			}
			next = time.Now().Add(retryPeriod(ttl))
		default:
			// Transport trouble: try again soon; the deadline ends it.
			next = time.Now().Add(retryPeriod(ttl))
		}
	}
}
