package redislock

import (
	"fmt"
	"strconv"
	"time"
)

// DefaultTTL is the lease of a hold taken without WithTTL; the watchdog
// renews it every third, so a crashed holder's lock frees itself within it.
const DefaultTTL = 30 * time.Second

// maxMs is the server's bound on a lease and a wait: 2^40 ms, about 34.8
// years. A time.Duration holds it (2^63 ns is 292 years).
const maxMs = int64(1) << 40

// Option tunes one acquisition.
type Option func(*options)

type options struct {
	ttl       time.Duration
	noRenew   bool
	wait      time.Duration
	waitSet   bool
	ephemeral bool
	permits   int
}

// WithTTL sets the lease (1 ms to 2^40 ms). The watchdog still renews it
// every third unless WithoutWatchdog is given too.
func WithTTL(ttl time.Duration) Option { return func(o *options) { o.ttl = ttl } }

// WithoutWatchdog: nothing renews the lease; the hold ends with it unless
// (*Lock).Renew is called. The loss still fires at the local deadline.
func WithoutWatchdog() Option { return func(o *options) { o.noRenew = true } }

// WithWait bounds a Lock call's wait (the server's WAIT): past it the call
// returns ErrTimedOut. Without it a Lock call waits as long as its context
// allows. TryLock ignores it.
func WithWait(d time.Duration) Option {
	return func(o *options) { o.wait, o.waitSet = d, true }
}

// Ephemeral binds the hold to a connection of its own, kept open for the
// hold's life: when it closes (the process dies, CLIENT KILL) the server
// ends the hold at once, and the loss fires within milliseconds.
func Ephemeral() Option { return func(o *options) { o.ephemeral = true } }

// WithPermits takes k of a semaphore's permits as one hold (semaphores only).
func WithPermits(k int) Option { return func(o *options) { o.permits = k } }

func collect(opts []Option) options {
	o := options{ttl: DefaultTTL}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// ms converts a duration the server accepts into its argument: whole
// milliseconds, rounded up, from min to 2^40.
func ms(d time.Duration, min int64, what string) (string, error) {
	n := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		n++
	}
	if d < 0 || n < min || n > maxMs {
		return "", fmt.Errorf("%w: %s must be from %d ms to 2^40 ms, not %v", ErrRefused, what, min, d)
	}
	return strconv.FormatInt(n, 10), nil
}

// Drift is the clock drift allowed for a lease of ttl: 1% of it plus 2 ms.
// The local deadline is send time + ttl - drift, so the client gives the
// lock up before any server can have let it go.
func Drift(ttl time.Duration) time.Duration {
	return ttl/100 + 2*time.Millisecond
}

// deadline is until when a lease of ttl confirmed for a command sent at
// sent is surely valid here (sent carries the monotonic clock).
func deadline(sent time.Time, ttl time.Duration) time.Time {
	d := ttl - Drift(ttl)
	if d < 0 {
		d = 0
	}
	return sent.Add(d)
}

// renewPeriod: every third of the lease, so two renews can fail before it ends.
func renewPeriod(ttl time.Duration) time.Duration {
	return max(ttl/3, time.Millisecond)
}

// retryPeriod: how soon the watchdog tries again after a renew that failed
// in transit.
func retryPeriod(ttl time.Duration) time.Duration {
	return min(max(ttl/30, 5*time.Millisecond), 500*time.Millisecond)
}
