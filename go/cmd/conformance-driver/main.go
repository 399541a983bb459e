// Command conformance-driver speaks the line protocol of the project's
// client conformance suite (docs/conformance.md) for the Go client: it
// reads requests on standard input, runs each in a goroutine of its own,
// and writes replies and loss events on standard output.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	redislock "github.com/redislock/redislock-go"
)

// handle is one hold the suite named: the lock and its loss event, which
// is written once, by whichever notices it first.
type handle struct {
	name string
	lock *redislock.Lock
	once sync.Once
}

type driver struct {
	outMu sync.Mutex
	out   *bufio.Writer

	mu      sync.Mutex
	client  *redislock.Client
	red     *redislock.Redlock
	rdb     redis.UniversalClient
	handles map[string]*handle
	objs    map[string]any
}

func main() {
	d := &driver{out: bufio.NewWriter(os.Stdout), handles: map[string]*handle{}, objs: map[string]any{}}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	var wg sync.WaitGroup
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		id, verb, args, err := parse(line)
		if err != nil {
			d.write(fmt.Sprintf("%s err bad-request %v", id, err))
			continue
		}
		if verb == "quit" {
			d.write(id + " ok")
			os.Exit(0)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.write(id + " " + d.run(verb, args))
		}()
	}
	wg.Wait()
}

func parse(line string) (id, verb string, args map[string]string, err error) {
	f := strings.Fields(line)
	if len(f) < 2 {
		if len(f) == 1 {
			return f[0], "", nil, errors.New("no verb")
		}
		return "0", "", nil, errors.New("empty line")
	}
	id, verb, args = f[0], f[1], map[string]string{}
	for _, kv := range f[2:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return id, verb, nil, fmt.Errorf("argument %q is not name=value", kv)
		}
		args[k] = v
	}
	return id, verb, args, nil
}

func (d *driver) write(line string) {
	d.outMu.Lock()
	defer d.outMu.Unlock()
	d.out.WriteString(line)
	d.out.WriteByte('\n')
	d.out.Flush()
}

// lost writes the handle's loss event, once.
func (d *driver) lost(h *handle) {
	var le *redislock.LostError
	if err := h.lock.Lost(); errors.As(err, &le) {
		h.once.Do(func() {
			d.write(fmt.Sprintf("! lost h=%s reason=%s", h.name, le.Reason))
		})
	}
}

func (d *driver) run(verb string, a map[string]string) string {
	switch verb {
	case "connect":
		return d.connect(a)
	case "leaks":
		d.mu.Lock()
		c, red := d.client, d.red
		d.mu.Unlock()
		n := 0
		if c != nil {
			n = c.Running()
		}
		if red != nil {
			n += red.Running()
		}
		return fmt.Sprintf("ok running=%d", n)
	}
	d.mu.Lock()
	c := d.client
	d.mu.Unlock()
	if c == nil {
		return "err bad-request not connected"
	}
	switch verb {
	case "acquire":
		return d.acquire(c, a)
	case "resume":
		return d.resume(c, a)
	case "renew", "release", "stop-renew", "status":
		h := d.handle(a["h"])
		if h == nil {
			return "err bad-request unknown handle " + a["h"]
		}
		return d.onHandle(verb, h, a)
	}
	return "err bad-request unknown verb " + verb
}

func (d *driver) connect(a map[string]string) string {
	var rdb redis.UniversalClient
	switch a["topology"] {
	case "redlock":
		var rdbs []redis.UniversalClient
		for _, u := range strings.Split(a["urls"], ",") {
			opt, err := redis.ParseURL(u)
			if err != nil {
				return "err bad-request " + err.Error()
			}
			rdbs = append(rdbs, redis.NewClient(opt))
		}
		red, err := redislock.NewRedlock(rdbs...)
		if err != nil {
			return errReply(err)
		}
		d.mu.Lock()
		d.red, d.client = red, redislock.New(rdbs[0])
		d.mu.Unlock()
		return "ok"
	case "", "single":
		opt, err := redis.ParseURL(a["url"])
		if err != nil {
			return "err bad-request " + err.Error()
		}
		rdb = redis.NewClient(opt)
	case "cluster":
		u, err := url.Parse(a["url"])
		if err != nil {
			return "err bad-request " + err.Error()
		}
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{u.Host}})
	case "sentinel":
		u, err := url.Parse(a["url"])
		if err != nil {
			return "err bad-request " + err.Error()
		}
		rdb = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: a["master"], SentinelAddrs: []string{u.Host}})
	default:
		return "err unsupported topology " + a["topology"]
	}
	d.mu.Lock()
	d.rdb, d.client = rdb, redislock.New(rdb)
	d.mu.Unlock()
	return "ok"
}

func (d *driver) handle(name string) *handle {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.handles[name]
}

// callContext is the call's context: cancelled after cancel= ms.
func callContext(a map[string]string) (context.Context, func(), error) {
	ctx, cancel := context.WithCancel(context.Background())
	if v, ok := a["cancel"]; ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			cancel()
			return nil, nil, fmt.Errorf("cancel=%q", v)
		}
		t := time.AfterFunc(time.Duration(n)*time.Millisecond, cancel)
		return ctx, func() { t.Stop(); cancel() }, nil
	}
	return ctx, cancel, nil
}

func msArg(v string) (time.Duration, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > 1<<40 {
		return 0, fmt.Errorf("%q is not a duration in ms", v)
	}
	return time.Duration(n) * time.Millisecond, nil
}

func (d *driver) acquire(c *redislock.Client, a map[string]string) string {
	name, key := a["h"], a["key"]
	var keys []string
	if v, ok := a["keys"]; ok {
		keys = strings.Split(v, ",")
		key = keys[0]
	}
	if name == "" || key == "" {
		return "err bad-request h= and key= are required"
	}
	var opts []redislock.Option
	if v, ok := a["ttl"]; ok {
		ttl, err := msArg(v)
		if err != nil {
			return "err bad-request ttl " + err.Error()
		}
		opts = append(opts, redislock.WithTTL(ttl))
	}
	switch a["renew"] {
	case "", "auto":
	case "off":
		opts = append(opts, redislock.WithoutWatchdog())
	default:
		return "err bad-request renew=" + a["renew"]
	}
	wait := false
	if v, ok := a["wait"]; ok {
		wait = true
		if v != "forever" {
			w, err := msArg(v)
			if err != nil {
				return "err bad-request wait " + err.Error()
			}
			opts = append(opts, redislock.WithWait(w))
		}
	}
	if a["ephemeral"] == "1" {
		opts = append(opts, redislock.Ephemeral())
	}
	ctx, done, err := callContext(a)
	if err != nil {
		return "err bad-request " + err.Error()
	}
	defer done()

	obj := a["obj"]
	var l *redislock.Lock
	d.mu.Lock()
	red := d.red
	d.mu.Unlock()
	if red != nil {
		if k := a["kind"]; k != "" && k != "lock" {
			return "err unsupported kind=" + k + " over Redlock"
		}
		if wait {
			l, err = red.Lock(ctx, key, opts...)
		} else {
			l, err = red.TryLock(ctx, key, opts...)
		}
		if err != nil {
			return errReply(err)
		}
		d.track(name, l)
		return fmt.Sprintf("ok fence=%d owner=%s", l.Fence(), l.Owner())
	}
	switch kind := a["kind"]; {
	case keys != nil && (kind == "" || kind == "lock"):
		if wait {
			l, err = c.LockKeys(ctx, keys, opts...)
		} else {
			l, err = c.TryLockKeys(ctx, keys, opts...)
		}
		if err != nil {
			return errReply(err)
		}
		d.track(name, l)
		fences := make([]string, 0, len(keys))
		for _, f := range l.Fences() {
			fences = append(fences, strconv.FormatInt(f, 10))
		}
		return fmt.Sprintf("ok fence=%s fences=%s owner=%s", fences[0], strings.Join(fences, ","), l.Owner())
	case keys != nil:
		return "err unsupported several keys at once: exclusive locks only"
	case kind == "" || kind == "lock":
		h := named(d, obj, func() *redislock.Handle { return c.Handle(key) })
		if wait {
			l, err = h.Lock(ctx, opts...)
		} else {
			l, err = h.TryLock(ctx, opts...)
		}
	case kind == "read" || kind == "write":
		rw := named(d, obj, func() *redislock.RWMutex { return c.RWMutex(key) })
		switch {
		case kind == "read" && wait:
			l, err = rw.RLock(ctx, opts...)
		case kind == "read":
			l, err = rw.TryRLock(ctx, opts...)
		case wait:
			l, err = rw.Lock(ctx, opts...)
		default:
			l, err = rw.TryLock(ctx, opts...)
		}
	case kind == "permit":
		limit := 1
		if v, ok := a["limit"]; ok {
			if limit, err = strconv.Atoi(v); err != nil {
				return "err bad-request limit=" + v
			}
		}
		if v, ok := a["permits"]; ok {
			k, perr := strconv.Atoi(v)
			if perr != nil {
				return "err bad-request permits=" + v
			}
			opts = append(opts, redislock.WithPermits(k))
		}
		s := c.Semaphore(key, limit)
		if wait {
			l, err = s.Acquire(ctx, opts...)
		} else {
			l, err = s.TryAcquire(ctx, opts...)
		}
	default:
		return "err bad-request kind=" + kind
	}
	if err != nil {
		return errReply(err)
	}
	d.track(name, l)
	return fmt.Sprintf("ok fence=%d owner=%s", l.Fence(), l.Owner())
}

// named is the object the request names with obj=, made by create the first
// time that name is used (and again if it named an object of another type);
// without a name, a new one.
func named[T comparable](d *driver, obj string, create func() T) T {
	var zero T
	if obj == "" {
		return create()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	o, _ := d.objs[obj].(T)
	if o == zero {
		o = create()
		d.objs[obj] = o
	}
	return o
}

// track names a new hold and writes its loss event the moment its
// context is cancelled for a loss.
func (d *driver) track(name string, l *redislock.Lock) {
	h := &handle{name: name, lock: l}
	d.mu.Lock()
	d.handles[name] = h
	d.mu.Unlock()
	go func() {
		<-l.Context().Done()
		d.lost(h)
	}()
}

func (d *driver) resume(c *redislock.Client, a map[string]string) string {
	name, key, owner := a["h"], a["key"], a["owner"]
	if name == "" || key == "" || owner == "" {
		return "err bad-request h=, key= and owner= are required"
	}
	ttl, err := msArg(a["ttl"])
	if err != nil {
		return "err bad-request ttl " + err.Error()
	}
	opts := []redislock.Option{redislock.WithTTL(ttl)}
	if a["renew"] == "off" {
		opts = append(opts, redislock.WithoutWatchdog())
	}
	var fence int64
	if v, ok := a["fence"]; ok {
		if fence, err = strconv.ParseInt(v, 10, 64); err != nil {
			return "err bad-request fence=" + v
		}
	}
	ctx, done, err := callContext(a)
	if err != nil {
		return "err bad-request " + err.Error()
	}
	defer done()
	l, err := c.Resume(ctx, key, owner, fence, opts...)
	if err != nil {
		return errReply(err)
	}
	d.track(name, l)
	return "ok"
}

func (d *driver) onHandle(verb string, h *handle, a map[string]string) string {
	l := h.lock
	switch verb {
	case "status":
		held, lost, reason := 0, 0, "-"
		if l.Held() {
			held = 1
		}
		var le *redislock.LostError
		if errors.As(l.Lost(), &le) {
			lost, reason = 1, string(le.Reason)
			d.lost(h)
		}
		return fmt.Sprintf("ok held=%d lost=%d reason=%s fence=%d", held, lost, reason, l.Fence())
	case "stop-renew":
		l.StopRenewing()
		return "ok"
	}
	ctx, done, err := callContext(a)
	if err != nil {
		return "err bad-request " + err.Error()
	}
	defer done()
	switch verb {
	case "renew":
		if v, ok := a["ttl"]; ok {
			ttl, perr := msArg(v)
			if perr != nil {
				return "err bad-request ttl " + perr.Error()
			}
			err = l.RenewFor(ctx, ttl)
		} else {
			err = l.Renew(ctx)
		}
	case "release":
		if a["all"] == "1" {
			err = l.ReleaseAll(ctx)
		} else {
			err = l.Release(ctx)
		}
	}
	if err != nil {
		// The loss event comes before the reply that reports it.
		d.lost(h)
		return errReply(err)
	}
	return "ok"
}

// errReply maps the client's errors onto the protocol's error kinds.
func errReply(err error) string {
	kinds := []struct {
		target error
		kind   string
	}{
		{redislock.ErrCancelled, "cancelled"},
		{redislock.ErrLost, "lost"},
		{redislock.ErrUpgrade, "upgrade"},
		{redislock.ErrLimitMismatch, "limit-mismatch"},
		{redislock.ErrQuarantine, "quarantine"},
		{redislock.ErrNotObtained, "not-obtained"},
		{redislock.ErrTimedOut, "timeout"},
		{redislock.ErrNotOwner, "not-owner"},
		{redislock.ErrRefused, "refused"},
	}
	msg := strings.ReplaceAll(err.Error(), "\n", " ")
	for _, k := range kinds {
		if errors.Is(err, k.target) {
			return "err " + k.kind + " " + msg
		}
	}
	return "err transport " + msg
}
