// Command bench compares this client with redsync, rueidislock and
// bsm/redislock on one server with the module loaded (LOCK_SERVER, default
// redis-server; LOCK_MODULE): uncontended lock/unlock per second; 32
// goroutines on one lock (throughput, wait p50/p99/max, fairness, server
// commands per acquisition); the takeover of a lock whose holder hangs
// (lease end) and of one whose holder is killed; and 32 goroutines taking 2
// or 4 of 8 keys at once, this client's LockKeys against bsm/redislock's
// ObtainMulti. It prints Markdown tables.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"

	redislock "github.com/redislock/redislock-go"
)

var bg = context.Background()

// lib is one library under test: take waits for the lock (as the library
// waits), the returned func releases it.
type lib struct {
	name  string
	take  func(ctx context.Context, key string) (func(), error)
	close func()
}

const ttl = 10 * time.Second

func libs(addr string) []lib {
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64, ClientName: "waiter"})
	ours := redislock.New(rdb)
	rs := redsync.New(rsgoredis.NewPool(rdb))
	bl := bsm.New(rdb)
	rl, err := rueidislock.NewLocker(rueidislock.LockerOption{
		ClientOption: rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, ClientName: "waiter"},
		KeyMajority:  1, KeyValidity: ttl, NoLoopTracking: true,
	})
	if err != nil {
		fail(err)
	}
	return []lib{
		{"redislock-go (this)", func(ctx context.Context, key string) (func(), error) {
			l, err := ours.Lock(ctx, key, redislock.WithTTL(ttl))
			if err != nil {
				return nil, err
			}
			return func() { _ = l.Release(bg) }, nil
		}, func() { ours.Close() }},
		{"redsync v4.18.1", func(ctx context.Context, key string) (func(), error) {
			m := rs.NewMutex(key, redsync.WithExpiry(ttl), redsync.WithTries(1<<30))
			if err := m.LockContext(ctx); err != nil {
				return nil, err
			}
			return func() { _, _ = m.UnlockContext(bg) }, nil
		}, func() {}},
		{"rueidislock v1.0.79", func(ctx context.Context, key string) (func(), error) {
			_, cancel, err := rl.WithContext(ctx, key)
			if err != nil {
				return nil, err
			}
			return cancel, nil
		}, rl.Close},
		{"bsm/redislock v0.10.0", func(ctx context.Context, key string) (func(), error) {
			l, err := bl.Obtain(ctx, key, ttl, &bsm.Options{RetryStrategy: bsm.LinearBackoff(2 * time.Millisecond)})
			if err != nil {
				return nil, err
			}
			return func() { _ = l.Release(bg) }, nil
		}, func() {}},
	}
}

func main() {
	srv, addr := start()
	defer srv.Process.Kill()
	ctl := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})
	fmt.Printf("One server (%s), loopback; %s.\n\n", version(ctl), time.Now().UTC().Format("2006-01-02"))
	fmt.Println("| library | uncontended lock+unlock /s | 32 goroutines: acquisitions /s | wait p50 | wait p99 | wait max | fairness (fewest/most per goroutine) | server commands per acquisition | hung holder: takeover after its 1 s lease | killed holder: takeover |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for i, l := range libs(addr) {
		un := uncontended(l, fmt.Sprintf("u%d", i))
		c := contended(ctl, l, fmt.Sprintf("c%d", i))
		hung := takeover(addr, i, false)
		killed := takeover(addr, i, true)
		fmt.Printf("| %s | %.0f | %.0f | %s | %s | %s | %d / %d | %.1f | %s | %s |\n",
			l.name, un, c.rate, ms(c.p50), ms(c.p99), ms(c.max), c.fewest, c.most, c.cmds, hung, killed)
		l.close()
	}
	severalTable(ctl, addr)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

func uncontended(l lib, key string) float64 {
	const n = 2000
	start := time.Now()
	for range n {
		release, err := l.take(bg, key)
		if err != nil {
			fail(err)
		}
		release()
	}
	return n / time.Since(start).Seconds()
}

type contention struct {
	rate          float64
	p50, p99, max time.Duration
	fewest, most  int
	cmds          float64
}

func contended(ctl *redis.Client, l lib, key string) contention {
	const workers, run = 32, 3 * time.Second
	before := calls(ctl)
	var mu sync.Mutex
	var waits []time.Duration
	counts := make([]int, workers)
	stop := time.Now().Add(run)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				ctx, cancel := context.WithDeadline(bg, stop.Add(2*time.Second))
				t0 := time.Now()
				release, err := l.take(ctx, key)
				cancel()
				if err != nil {
					continue
				}
				wait := time.Since(t0)
				time.Sleep(100 * time.Microsecond) // the work under the lock
				release()
				mu.Lock()
				waits = append(waits, wait)
				counts[w]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(stop.Add(-run))
	slices.Sort(waits)
	n := len(waits)
	if n == 0 {
		return contention{}
	}
	c := contention{
		rate: float64(n) / elapsed.Seconds(),
		p50:  waits[n/2], p99: waits[n*99/100], max: waits[n-1],
		fewest: slices.Min(counts), most: slices.Max(counts),
		cmds: float64(calls(ctl)-before) / float64(n),
	}
	return c
}

// takeover: a holder takes the lock with a 1 s lease and then hangs (no
// renewal, no release) or is killed (its connections closed); a waiter
// already waiting gets the lock after how long.
func takeover(addr string, i int, kill bool) string {
	key := fmt.Sprintf("t%d-%v", i, kill)
	ctl := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})
	defer ctl.Close()
	holderRdb := redis.NewClient(&redis.Options{Addr: addr, ClientName: "holder"})
	defer holderRdb.Close()
	const lease = time.Second
	switch i {
	case 0:
		opts := []redislock.Option{redislock.WithTTL(lease), redislock.WithoutWatchdog()}
		if kill {
			opts = []redislock.Option{redislock.WithTTL(lease), redislock.Ephemeral()}
		}
		if _, err := redislock.New(holderRdb).TryLock(bg, key, opts...); err != nil {
			fail(err)
		}
	case 1:
		m := redsync.New(rsgoredis.NewPool(holderRdb)).NewMutex(key, redsync.WithExpiry(lease))
		if err := m.Lock(); err != nil {
			fail(err)
		}
	case 2:
		if kill {
			return "n/a: its extender reconnects (a dead process frees it at KeyValidity)"
		}
		return "n/a: it always extends"
	case 3:
		if _, err := bsm.New(holderRdb).Obtain(bg, key, lease, nil); err != nil {
			fail(err)
		}
	}
	held := time.Now()
	got := make(chan time.Time, 1)
	w := libs(addr)[i]
	defer w.close()
	go func() {
		release, err := w.take(bg, key)
		if err != nil {
			fail(err)
		}
		got <- time.Now()
		release()
	}()
	time.Sleep(100 * time.Millisecond)
	var killed time.Time
	if kill {
		killed = killHolder(ctl)
	}
	t := <-got
	if kill {
		return fmt.Sprintf("%s after the kill", ms(t.Sub(killed)))
	}
	return fmt.Sprintf("%s after the lease end", ms(t.Sub(held.Add(lease))))
}

// killHolder closes every connection the holder opened: those named
// "holder" by go-redis, and the unnamed ones of this client (its own lock
// connections) but the waiter's, which is parked in the server (flag b).
// It returns when the first kill was sent.
func killHolder(ctl *redis.Client) time.Time {
	list, _ := ctl.ClientList(bg).Result()
	me, _ := ctl.ClientID(bg).Result()
	var ids []int64
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		f := map[string]string{}
		for _, kv := range strings.Fields(line) {
			k, v, _ := strings.Cut(kv, "=")
			f[k] = v
		}
		id, _ := strconv.ParseInt(f["id"], 10, 64)
		if id != me && (f["name"] == "holder" || (f["name"] == "" && !strings.Contains(f["flags"], "b"))) {
			ids = append(ids, id)
		}
	}
	at := time.Now()
	for _, id := range ids {
		ctl.Do(bg, "CLIENT", "KILL", "ID", id)
	}
	return at
}

func calls(ctl *redis.Client) int64 {
	var total int64
	for _, n := range cmdCalls(ctl) {
		total += n
	}
	return total
}

// cmdCalls: the server's calls per command (INFO commandstats, lower case,
// "lock.macquire"), less INFO, which the bench itself sends.
func cmdCalls(ctl *redis.Client) map[string]int64 {
	s, _ := ctl.Info(bg, "commandstats").Result()
	out := map[string]int64{}
	for _, line := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		i := strings.Index(rest, "calls=")
		if !ok || i < 0 || name == "info" {
			continue
		}
		n, _ := strconv.ParseInt(strings.SplitN(rest[i+6:], ",", 2)[0], 10, 64)
		out[name] += n
	}
	return out
}

func version(ctl *redis.Client) string {
	s, _ := ctl.Info(bg, "server").Result()
	name, ver := "redis", ""
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
			ver = v
		}
		if v, ok := strings.CutPrefix(line, "valkey_version:"); ok {
			name, ver = "valkey", v
		}
	}
	return name + " " + ver
}

func start() (*exec.Cmd, string) {
	bin := os.Getenv("LOCK_SERVER")
	if bin == "" {
		bin = "redis-server"
	}
	mod := os.Getenv("LOCK_MODULE")
	if mod == "" {
		fail(errors.New("LOCK_MODULE is not set"))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir, _ := os.MkdirTemp("", "bench-go")
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--dir", dir, "--logfile", filepath.Join(dir, "log"), "--loadmodule", mod, "--maxclients", "10000")
	if err := cmd.Start(); err != nil {
		fail(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	for range 500 {
		if c.Ping(bg).Err() == nil {
			return cmd, addr
		}
		time.Sleep(10 * time.Millisecond)
	}
	fail(errors.New("the server did not start"))
	return nil, ""
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}
