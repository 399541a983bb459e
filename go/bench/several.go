package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	redislock "github.com/redislock/redislock-go"
)

// multiLib is one library's lock on several keys at once: take waits (as
// the library waits) until it holds every key, the returned func releases
// them all. failed reports the failed acquisition attempts since the
// previous call given the server's command counts over the run (delta)
// and the acquisitions, from what the library or the server lets one count.
type multiLib struct {
	name   string
	take   func(ctx context.Context, keys []string) (func(), error)
	failed func(delta map[string]int64, acquired int64) int64
	close  func()
}

// countingBackoff is bsm/redislock's retry strategy with a count: the
// library asks it for the next backoff once after every failed attempt.
type countingBackoff struct {
	bsm.RetryStrategy
	n *atomic.Int64
}

func (c countingBackoff) NextBackoff() time.Duration {
	c.n.Add(1)
	return c.RetryStrategy.NextBackoff()
}

// multiLibs: the libraries that take several keys as one lock. redsync and
// rueidislock have no such call (a mutex names one key), so they are not
// here.
func multiLibs(addr string) []multiLib {
	ourRdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64, ClientName: "waiter"})
	ours := redislock.New(ourRdb)
	bsmRdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64, ClientName: "waiter"})
	bl := bsm.New(bsmRdb)
	var bsmFailed atomic.Int64
	retry := countingBackoff{bsm.LinearBackoff(2 * time.Millisecond), &bsmFailed}
	return []multiLib{
		{"redislock-go (this) `LockKeys`", func(ctx context.Context, keys []string) (func(), error) {
			l, err := ours.LockKeys(ctx, keys, redislock.WithTTL(ttl))
			if err != nil {
				return nil, err
			}
			return func() { _ = l.Release(bg) }, nil
		}, func(delta map[string]int64, acquired int64) int64 {
			// One LOCK.MACQUIRE … WAIT per attempt: the server queues it,
			// so an attempt fails only when its wait runs out; those are
			// the calls beyond the acquisitions.
			return delta["lock.macquire"] - acquired
		}, func() { ours.Close(); ourRdb.Close() }},
		{"bsm/redislock v0.10.0 `ObtainMulti`", func(ctx context.Context, keys []string) (func(), error) {
			l, err := bl.ObtainMulti(ctx, keys, ttl, &bsm.Options{RetryStrategy: retry})
			if err != nil {
				return nil, err
			}
			return func() { _ = l.Release(bg) }, nil
		}, func(map[string]int64, int64) int64 { return bsmFailed.Swap(0) }, func() { bsmRdb.Close() }},
	}
}

type severalRow struct {
	contention
	failed   float64 // failed attempts per acquisition
	overlaps int64   // holds that found a key already held in the process
}

// several: 32 goroutines, each looping over requests for width of 8 keys,
// drawn at random in a random order: take them all, INCR a counter, give
// them back, for run. The wait is from the call to the grant. A key held
// twice at once (seen in the process, leases being long) counts as an
// overlap.
func several(ctl, data *redis.Client, l multiLib, prefix string, width int) severalRow {
	const workers, nkeys, run = 32, 8, 3 * time.Second
	names := make([]string, nkeys)
	for i := range names {
		names[i] = fmt.Sprintf("%s:%d", prefix, i)
	}
	var held [nkeys]atomic.Int32
	var overlaps atomic.Int64
	l.failed(nil, 0)
	before := cmdCalls(ctl)
	var mu sync.Mutex
	var waits []time.Duration
	counts := make([]int, workers)
	stop := time.Now().Add(run)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(width)))
			keys := make([]string, width)
			for time.Now().Before(stop) {
				picked := rng.Perm(nkeys)[:width]
				for i, k := range picked {
					keys[i] = names[k]
				}
				ctx, cancel := context.WithDeadline(bg, stop.Add(2*time.Second))
				t0 := time.Now()
				release, err := l.take(ctx, keys)
				cancel()
				if err != nil {
					continue
				}
				wait := time.Since(t0)
				for _, k := range picked {
					if held[k].Add(1) != 1 {
						overlaps.Add(1)
					}
				}
				data.Incr(bg, prefix+":counter")
				for _, k := range picked {
					held[k].Add(-1)
				}
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
	after := cmdCalls(ctl)
	delta := map[string]int64{}
	var total int64
	for name, n := range after {
		delta[name] = n - before[name]
		total += n - before[name]
	}
	n := len(waits)
	if n == 0 {
		return severalRow{}
	}
	slices.Sort(waits)
	failed := float64(l.failed(delta, int64(n))) / float64(n)
	return severalRow{
		contention: contention{
			rate: float64(n) / elapsed.Seconds(),
			p50:  waits[n/2], p99: waits[n*99/100], max: waits[n-1],
			fewest: slices.Min(counts), most: slices.Max(counts),
			cmds: float64(total) / float64(n),
		},
		failed:   failed,
		overlaps: overlaps.Load(),
	}
}

// severalTable prints the several-at-once table: each library at 2 and 4
// keys of 8 per request.
func severalTable(ctl *redis.Client, addr string) {
	fmt.Println()
	fmt.Println("Several keys at once: 32 goroutines, each request 2 (or 4) of 8 keys in a random order; acquire, one INCR, release; 3 s a row.")
	fmt.Println()
	fmt.Println("| library | keys per request | acquisitions /s | wait p50 | wait p99 | wait max | fewest / most per goroutine | failed attempts per acquisition | server commands per acquisition (with the INCR) | overlapping holds |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	// The INCRs go over a pool of their own: ctl has one connection.
	data := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	defer data.Close()
	for i, l := range multiLibs(addr) {
		for _, width := range []int{2, 4} {
			r := several(ctl, data, l, fmt.Sprintf("m%d-%d", i, width), width)
			fmt.Printf("| %s | %d of 8 | %.0f | %s | %s | %s | %d / %d | %.2f | %.1f | %d |\n",
				l.name, width, r.rate, ms(r.p50), ms(r.p99), ms(r.max), r.fewest, r.most, r.failed, r.cmds, r.overlaps)
		}
		l.close()
	}
	fmt.Println()
	fmt.Println("redsync and rueidislock: no lock on several keys (a mutex names one key), so no row.")
}
