package redislock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client takes locks on the servers its backend reaches. It is safe for
// concurrent use; make one per application and Close it at the end.
type Client struct {
	b Backend

	mu      sync.Mutex
	idle    map[string][]*link
	maxIdle int

	// running counts background activities: watchdogs, ephemeral
	// bindings, clean-ups after a cancel, release retries, and connections
	// lent to a call in progress.
	running atomic.Int64
}

// New makes a client over a go-redis v9 client (one server, a Sentinel
// failover client or a Cluster).
func New(rdb redis.UniversalClient) *Client { return NewWithBackend(GoRedis(rdb)) }

// NewWithBackend makes a client over any Backend.
func NewWithBackend(b Backend) *Client {
	return &Client{b: b, idle: map[string][]*link{}, maxIdle: 64}
}

// Running is how many background activities of the client are alive now
// (watchdogs, ephemeral bindings, clean-ups, retries, calls in progress).
// Once every lock is released and every call has returned it falls to 0.
func (c *Client) Running() int { return int(c.running.Load()) }

// Close closes the idle connections. Held locks are not released: release
// them first (or they end with their leases).
func (c *Client) Close() error {
	c.mu.Lock()
	idle := c.idle
	c.idle = map[string][]*link{}
	c.mu.Unlock()
	for _, ls := range idle {
		for _, l := range ls {
			l.close()
		}
	}
	return nil
}

// newOwner is a random 128-bit token: no two holders share one.
func newOwner() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// getLink lends an idle connection to ep's server, or opens one.
func (c *Client) getLink(ctx context.Context, ep Endpoint) (*link, error) {
	c.mu.Lock()
	ls := c.idle[ep.Addr]
	for len(ls) > 0 {
		l := ls[len(ls)-1]
		ls = ls[:len(ls)-1]
		if !l.isDead() {
			c.idle[ep.Addr] = ls
			c.mu.Unlock()
			c.running.Add(1)
			return l, nil
		}
	}
	c.idle[ep.Addr] = ls
	c.mu.Unlock()
	l, err := openLink(ctx, ep)
	if err != nil {
		return nil, err
	}
	c.running.Add(1)
	return l, nil
}

// putLink takes a lent connection back; one still awaiting a reply, or
// dead, is closed instead.
func (c *Client) putLink(l *link) {
	c.running.Add(-1)
	if l.isDead() || l.busy() {
		l.close()
		return
	}
	c.mu.Lock()
	if len(c.idle[l.ep.Addr]) < c.maxIdle {
		c.idle[l.ep.Addr] = append(c.idle[l.ep.Addr], l)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	l.close()
}

// dropIdle closes the idle connections to addr: after a READONLY they all
// lead to a node that is no longer the master, and the next call must ask
// the topology again.
func (c *Client) dropIdle(addr string) {
	c.mu.Lock()
	idle := c.idle[addr]
	delete(c.idle, addr)
	c.mu.Unlock()
	for _, l := range idle {
		l.close()
	}
}

// dropLink closes a lent connection (an ephemeral hold's, once over).
func (c *Client) dropLink(l *link) {
	l.close()
	c.running.Add(-1)
}

// spawn runs f as a counted background activity.
func (c *Client) spawn(f func()) {
	c.running.Add(1)
	go func() {
		defer c.running.Add(-1)
		f()
	}()
}

// redirect reads a cluster redirection: MOVED or ASK, and the address.
func redirect(err error) (kind, addr string, ok bool) {
	var se ServerError
	if !errors.As(err, &se) {
		return "", "", false
	}
	f := strings.Fields(string(se))
	if len(f) == 3 && (f[0] == "MOVED" || f[0] == "ASK") {
		return f[0], f[2], true
	}
	return "", "", false
}

// dropsConnection: replies after which the next command must find the
// master again (a replica answering, a master without its replicas).
func dropsConnection(err error) bool {
	var se ServerError
	if !errors.As(err, &se) {
		return false
	}
	p := se.prefix()
	return p == "READONLY" || p == "NOREPLICAS" || p == "MASTERDOWN"
}

// giveBack returns l after a reply from ep: a reply that says the node no
// longer serves writes (READONLY, NOREPLICAS) closes l and the node's idle
// connections, so the next command asks again. A redirection (within five
// hops) points ep at the node named, and MOVED refreshes the slot map
// first; ok says to send again, kind which redirection it was.
func (c *Client) giveBack(ctx context.Context, l *link, ep *Endpoint, err error, hop int) (kind string, ok bool) {
	if dropsConnection(err) {
		l.close()
		c.dropIdle(ep.Addr)
	}
	c.putLink(l)
	kind, addr, ok := redirect(err)
	if !ok || hop >= 5 {
		return "", false
	}
	if kind == "MOVED" {
		c.b.Refresh(ctx)
	}
	ep.Addr = addr
	return kind, true
}

// exec runs one command about key on a connection of its own and gives the
// connection back. A context that ends first closes that connection (its
// reply is unknown) and returns ErrCancelled.
func (c *Client) exec(ctx context.Context, key string, args ...string) (any, error) {
	ep, err := c.b.Endpoint(ctx, key)
	if err != nil {
		return nil, err
	}
	for hop := 0; ; hop++ {
		l, err := c.getLink(ctx, ep)
		if err != nil {
			return nil, err
		}
		v, err := l.do(ctx, args...)
		if errors.Is(err, ErrCancelled) {
			l.close()
			c.putLink(l)
			return nil, err
		}
		if kind, ok := c.giveBack(ctx, l, &ep, err, hop); ok {
			if kind == "ASK" {
				return c.execAsking(ctx, ep, args)
			}
			continue
		}
		return v, err
	}
}

// execAsking follows an ASK redirection: ASKING, then the command, on one
// connection to the node the slot is moving to.
func (c *Client) execAsking(ctx context.Context, ep Endpoint, args []string) (any, error) {
	l, err := c.getLink(ctx, ep)
	if err != nil {
		return nil, err
	}
	l.send("ASKING")
	v, err := l.do(ctx, args...)
	if errors.Is(err, ErrCancelled) {
		l.close()
	}
	c.putLink(l)
	return v, err
}

// mode is how a hold is asked for: exclusive, shared (a read lock), or a
// semaphore's permits.
type mode struct {
	shared  bool
	limit   int
	permits int
	// keys, when set, are taken all at once (LOCK.MACQUIRE), the key
	// acquire names being the first of them (its routing).
	keys []string
}

// acquireArgs: LOCK.ACQUIRE key owner ttl, or LOCK.MACQUIRE numkeys keys...
// owner ttl for several keys.
func (m mode) acquireArgs(key, owner, ttl string) []string {
	if m.keys == nil {
		return []string{"LOCK.ACQUIRE", key, owner, ttl}
	}
	a := append([]string{"LOCK.MACQUIRE", strconv.Itoa(len(m.keys))}, m.keys...)
	return append(a, owner, ttl)
}

// renewArgs: LOCK.RENEW, or LOCK.MRENEW of every key (all or none).
func (m mode) renewArgs(key, owner, ttl string) []string {
	if m.keys == nil {
		return []string{"LOCK.RENEW", key, owner, ttl}
	}
	a := append([]string{"LOCK.MRENEW", strconv.Itoa(len(m.keys))}, m.keys...)
	return append(a, owner, ttl)
}

// releaseArgs: LOCK.RELEASE [ALL], or LOCK.MRELEASE of every key.
func (m mode) releaseArgs(key, owner string, all bool) []string {
	a := []string{"LOCK.RELEASE", key, owner}
	if m.keys != nil {
		a = append(append([]string{"LOCK.MRELEASE", strconv.Itoa(len(m.keys))}, m.keys...), owner)
	}
	if all {
		a = append(a, "ALL")
	}
	return a
}

// fencesOf reads a grant: LOCK.ACQUIRE's fence, or LOCK.MACQUIRE's array
// of them in key order.
func fencesOf(v any) ([]int64, bool) {
	switch got := v.(type) {
	case int64:
		return []int64{got}, true
	case []any:
		fences := make([]int64, 0, len(got))
		for _, f := range got {
			n, ok := f.(int64)
			if !ok {
				return nil, false
			}
			fences = append(fences, n)
		}
		return fences, len(fences) > 0
	}
	return nil, false
}

func (m mode) args() []string {
	var a []string
	if m.shared {
		a = append(a, "SHARED")
		if m.limit > 0 {
			a = append(a, "LIMIT", strconv.Itoa(m.limit))
			if m.permits > 0 {
				a = append(a, "PERMITS", strconv.Itoa(m.permits))
			}
		}
	}
	return a
}

// Lock takes key under a new owner, waiting as long as ctx allows (or
// WithWait says). Cancelling ctx at any point leaves nothing held.
func (c *Client) Lock(ctx context.Context, key string, opts ...Option) (*Lock, error) {
	return c.acquire(ctx, key, newOwner(), mode{}, collect(opts), true, nil)
}

// TryLock takes key under a new owner if it is free now: ErrNotObtained
// otherwise.
func (c *Client) TryLock(ctx context.Context, key string, opts ...Option) (*Lock, error) {
	return c.acquire(ctx, key, newOwner(), mode{}, collect(opts), false, nil)
}

// MaxKeys is the most keys one lock on several keys may name.
const MaxKeys = 64

// LockKeys takes every one of keys together, all or none, waiting as long
// as ctx allows (or WithWait says): the server queues the request on every
// key at once and grants it when all of them can be granted in the same
// step, never some while it waits, so locks on the same keys in any order
// never deadlock, and no later request takes one of its keys first. The
// Lock holds them all (Keys, Fences): one watchdog renews every key with
// one LOCK.MRENEW, a loss of any key is a loss of the Lock (its Context is
// cancelled), and Release gives every key back. 1 to 64 distinct keys; in
// a cluster they must share a hash slot. Cancelling ctx leaves no key held.
func (c *Client) LockKeys(ctx context.Context, keys []string, opts ...Option) (*Lock, error) {
	return c.acquireKeys(ctx, keys, opts, true)
}

// TryLockKeys takes every one of keys if all can be taken now:
// ErrNotObtained otherwise, and then no key is held.
func (c *Client) TryLockKeys(ctx context.Context, keys []string, opts ...Option) (*Lock, error) {
	return c.acquireKeys(ctx, keys, opts, false)
}

func (c *Client) acquireKeys(ctx context.Context, keys []string, opts []Option, wait bool) (*Lock, error) {
	if len(keys) < 1 || len(keys) > MaxKeys {
		return nil, fmt.Errorf("%w: a lock on several keys takes 1 to %d keys, not %d", ErrRefused, MaxKeys, len(keys))
	}
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if seen[k] {
			return nil, fmt.Errorf("%w: a lock on several keys names each key once (%q twice)", ErrRefused, k)
		}
		seen[k] = true
	}
	md := mode{keys: slices.Clone(keys)}
	return c.acquire(ctx, keys[0], newOwner(), md, collect(opts), wait, nil)
}

// acquire is every acquisition's one path: LOCK.ACQUIRE on a connection of
// its own, the wait parked there, a cancel cleaned up there.
func (c *Client) acquire(ctx context.Context, key, owner string, md mode, o options, wait bool, bt *bindingTable) (*Lock, error) {
	ttlArg, err := ms(o.ttl, 1, "the lease")
	if err != nil {
		return nil, err
	}
	base := md.acquireArgs(key, owner, ttlArg)
	base = append(base, md.args()...)
	if o.ephemeral {
		base = append(base, "EPHEMERAL")
	}
	args := base
	if wait {
		w := "0"
		if o.waitSet {
			if w, err = ms(o.wait, 0, "the wait"); err != nil {
				return nil, err
			}
		}
		args = append(args[:len(args):len(args)], "WAIT", w)
	}
	called := time.Now()
	if err := ctx.Err(); err != nil {
		return nil, cancelled(err)
	}
	ep, err := c.b.Endpoint(ctx, key)
	if err != nil {
		return nil, err
	}
	ask := false
	for hop := 0; ; hop++ {
		l, err := c.getLink(ctx, ep)
		if err != nil {
			return nil, err
		}
		if ask {
			l.send("ASKING")
		}
		sent := time.Now()
		pending := l.send(args...)
		// A try's grant is worthless once its lease's deadline has
		// passed: give up then, as a cancel (a wait's grant is confirmed
		// by a renew instead).
		var late <-chan time.Time
		if !wait {
			t := time.NewTimer(time.Until(deadline(sent, o.ttl)))
			defer t.Stop()
			late = t.C
		}
		var r reply
		select {
		case r = <-pending:
		case <-ctx.Done():
			c.abandon(l, md, key, owner, o.ttl, wait, pending, false)
			return nil, cancelled(ctx.Err())
		case <-late:
			c.abandon(l, md, key, owner, o.ttl, false, pending, false)
			return nil, cancelled(context.DeadlineExceeded)
		}
		v, err := r.result()
		if err != nil {
			if r.err != nil {
				// The connection broke with the command sent: a grant may
				// have happened. Release it in the background (best effort:
				// the lease ends it otherwise).
				c.putLink(l)
				c.releaseCmdLater(key, md.releaseArgs(key, owner, false), nil, time.Now().Add(o.ttl))
				return nil, err
			}
			if kind, ok := c.giveBack(ctx, l, &ep, err, hop); ok {
				ask = kind == "ASK"
				continue
			}
			var se ServerError
			if errors.As(err, &se) {
				return nil, mapServerError(se)
			}
			return nil, err
		}
		if v == nil {
			if !wait {
				err = c.whyNotObtained(ctx, l, key, md.keys)
			} else {
				err = ErrTimedOut
			}
			c.putLink(l)
			return nil, err
		}
		fences, ok := fencesOf(v)
		if !ok {
			c.putLink(l)
			return nil, transportError(errProtocol)
		}
		// A wait longer than a third of the lease: confirm with a renew, so
		// the deadline counts from a send we know the server answered soon.
		if wait && time.Since(sent) > o.ttl/3 {
			sent = time.Now()
			var rr reply
			select {
			case rr = <-l.send(md.renewArgs(key, owner, ttlArg)...):
			case <-ctx.Done():
				c.abandon(l, md, key, owner, o.ttl, false, nil, true)
				return nil, cancelled(ctx.Err())
			}
			if _, err := rr.result(); err != nil {
				var se ServerError
				if errors.As(err, &se) && errors.Is(mapServerError(se), ErrNotOwner) {
					// The grant was gone before its confirmation (a DEL, a
					// failover, and someone else took it): it was not a
					// hold. Wait again within what is left of the wait.
					c.putLink(l)
					w := "0"
					if o.waitSet {
						left := o.wait - time.Since(called)
						if left <= 0 {
							return nil, ErrTimedOut
						}
						w, _ = ms(left, 0, "the wait")
					}
					args = append(base[:len(base):len(base)], "WAIT", w)
					hop = -1
					continue
				}
				c.abandon(l, md, key, owner, o.ttl, false, nil, true)
				if errors.As(err, &se) {
					return nil, mapServerError(se)
				}
				return nil, err
			}
		}
		var bound *link
		var b *binding
		if o.ephemeral {
			bound, b = bt.bind(c, key, l)
		} else {
			c.putLink(l)
		}
		return c.start(key, owner, slices.Max(fences), o, sent, bound, nil, b, md.keys, fences), nil
	}
}

// whyNotObtained tells a try refused for the quarantine (the lock is free
// and the server begins no hold) from one refused because it is held.
func (c *Client) whyNotObtained(ctx context.Context, l *link, key string, keys []string) error {
	if keys == nil {
		keys = []string{key}
	}
	infos := make([]chan reply, 0, len(keys))
	for _, k := range keys {
		infos = append(infos, l.send("LOCK.INFO", k))
	}
	stats := l.send("INFO", "lock")
	held := false
	for _, info := range infos {
		select {
		case ri := <-info:
			held = held || ri.err != nil || ri.v != nil
		case <-ctx.Done():
			return ErrNotObtained
		}
	}
	var rs reply
	select {
	case rs = <-stats:
	case <-ctx.Done():
		return ErrNotObtained
	}
	if held {
		return ErrNotObtained
	}
	if s, ok := rs.v.(string); ok {
		for _, line := range strings.Split(s, "\n") {
			if v, found := strings.CutPrefix(strings.TrimSpace(line), "lock_quarantine_ms:"); found && v != "0" {
				return ErrQuarantine
			}
		}
	}
	return ErrNotObtained
}

// abandon cleans up after a cancel, in the background, on the connection
// that asked: a parked wait is woken with CLIENT UNBLOCK (sent from another
// connection), and a grant that crossed the cancel is released on l, after
// it, so nothing is left held. pending is the acquire's reply still to
// come; granted says the grant is already known.
func (c *Client) abandon(l *link, md mode, key, owner string, ttl time.Duration, parked bool, pending chan reply, granted bool) {
	c.spawn(func() {
		defer c.putLink(l)
		if !granted {
			r := c.awaitAfterCancel(l, key, pending, parked)
			_, granted = fencesOf(r.v)
		}
		if granted {
			// One release: the call's own hold (a reentry leaves the
			// owner's earlier holds in place).
			args := md.releaseArgs(key, owner, false)
			rel := <-l.send(args...)
			if rel.err != nil {
				c.releaseCmdLater(key, args, nil, time.Now().Add(ttl))
			}
		}
	})
}

// awaitAfterCancel waits for the reply of an acquire whose caller gave up,
// waking it with CLIENT UNBLOCK while it is parked (again, with backoff:
// an unblock that reached the server before the acquire found nothing to
// wake). A plain UNBLOCK after a grant changes nothing: the reply is then
// the fence, and the caller releases it.
func (c *Client) awaitAfterCancel(l *link, key string, pending chan reply, parked bool) reply {
	if !parked {
		return <-pending
	}
	delay := time.Duration(0)
	for {
		t := time.NewTimer(delay)
		select {
		case r := <-pending:
			t.Stop()
			return r
		case <-t.C:
		}
		c.unblock(l, key)
		delay = min(2*delay+5*time.Millisecond, 200*time.Millisecond)
	}
}

// unblock wakes l's parked wait, but only once LOCK.QUEUE lists it: a
// command the server postponed (writes paused) is not parked yet, and
// Redis 7.0 crashes on a CLIENT UNBLOCK of a postponed client.
func (c *Client) unblock(l *link, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	u, err := c.getLink(ctx, l.ep)
	if err != nil {
		return
	}
	defer c.putLink(u)
	v, err := u.do(ctx, "LOCK.QUEUE", key)
	if err != nil || !queued(v, l.id) {
		return
	}
	_, _ = u.do(ctx, "CLIENT", "UNBLOCK", l.id)
}

// queued: whether a LOCK.QUEUE reply lists the client id.
func queued(v any, id string) bool {
	entries, _ := v.([]any)
	for _, e := range entries {
		fields, _ := e.([]any)
		for i := 0; i+1 < len(fields); i += 2 {
			if fields[i] == "client" {
				switch got := fields[i+1].(type) {
				case int64:
					if strconv.FormatInt(got, 10) == id {
						return true
					}
				case string:
					if got == id {
						return true
					}
				}
			}
		}
	}
	return false
}

// releaseLater retries a release in the background until it lands (or the
// server says the owner holds nothing) or until, at the lease end, there
// is nothing left to release. bound, when set, is the ephemeral hold's own
// connection, used first (and closed after).
func (c *Client) releaseLater(key, owner string, all bool, bound *link, until time.Time) {
	c.releaseCmdLater(key, mode{}.releaseArgs(key, owner, all), bound, until)
}

// releaseCmdLater is releaseLater of a release command given whole (a
// LOCK.MRELEASE of several keys, routed by key).
func (c *Client) releaseCmdLater(key string, args []string, bound *link, until time.Time) {
	c.spawn(func() {
		delay := 5 * time.Millisecond
		for time.Now().Before(until) {
			ctx, cancel := context.WithDeadline(context.Background(), until)
			var err error
			if bound != nil && !bound.isDead() {
				_, err = bound.do(ctx, args...)
			} else {
				_, err = c.exec(ctx, key, args...)
			}
			cancel()
			var se ServerError
			if err == nil || errors.As(err, &se) {
				break
			}
			t := time.NewTimer(delay)
			<-t.C
			delay = min(2*delay, time.Second)
		}
		if bound != nil {
			c.dropLink(bound)
		}
	})
}

// bindingTable keeps an owner object's ephemeral holds' connections, by
// key. The server binds a hold to the connection it began on, and ends it,
// whatever its count, when that connection closes: so a reentry through
// the same object shares that connection, and it closes only when the last
// of the object's holds on the key is over.
type bindingTable struct {
	mu sync.Mutex
	m  map[string]*binding
}

type binding struct {
	t    *bindingTable
	key  string
	link *link
	refs int
}

// bind: the connection a new ephemeral hold on key is bound to: l for a
// fresh hold, the object's existing one for a reentry (l goes back to the
// pool then). Without a table (one owner per call) it is l.
func (t *bindingTable) bind(c *Client, key string, l *link) (*link, *binding) {
	if t == nil {
		return l, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]*binding{}
	}
	if b := t.m[key]; b != nil && !b.link.isDead() {
		b.refs++
		c.putLink(l)
		return b.link, b
	}
	b := &binding{t: t, key: key, link: l, refs: 1}
	t.m[key] = b
	return l, b
}

// done: one hold sharing b is over; true when it was the last, and the
// connection may close.
func (b *binding) done() bool {
	b.t.mu.Lock()
	defer b.t.mu.Unlock()
	b.refs--
	if b.refs > 0 {
		return false
	}
	if b.t.m[b.key] == b {
		delete(b.t.m, b.key)
	}
	return true
}
