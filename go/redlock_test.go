package redislock

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func redlockOver(t *testing.T, servers []*server) *Redlock {
	t.Helper()
	var rdbs []redis.UniversalClient
	for _, s := range servers {
		rdb := redis.NewClient(&redis.Options{Addr: s.addr})
		t.Cleanup(func() { rdb.Close() })
		rdbs = append(rdbs, rdb)
	}
	r, err := NewRedlock(rdbs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func threeServers(t *testing.T) []*server {
	return []*server{startServer(t), startServer(t), startServer(t)}
}

func TestRedlockTakesAMajorityAndFencesRiseAcrossHolders(t *testing.T) {
	ss := threeServers(t)
	r := redlockOver(t, ss)
	a, err := r.TryLock(bg, "k")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		if got := s.owners(t, "k"); len(got) != 1 || got[0] != a.Owner() {
			t.Fatalf("holders on %s: %v", s.addr, got)
		}
	}
	if _, err := r.TryLock(bg, "k"); !errors.Is(err, ErrNotObtained) {
		t.Fatalf("a second Redlock try: %v", err)
	}
	// The fence round: one server's counter jumps far ahead; the next
	// holder's fence must still be above the first's everywhere.
	if err := ss[1].rdb.Do(bg, "LOCK.FENCE", "k", a.Owner(), a.Fence()+1_000_000).Err(); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(bg); err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		if s.owners(t, "k") != nil {
			t.Fatalf("still held on %s after the release", s.addr)
		}
	}
	b, err := r.Lock(bg, "k")
	if err != nil {
		t.Fatal(err)
	}
	if b.Fence() <= a.Fence()+1_000_000 {
		t.Fatalf("fence %d not above the raised %d", b.Fence(), a.Fence()+1_000_000)
	}
	_ = b.Release(bg)
	waitFor(t, "no background activity", 3*time.Second, func() bool { return r.Running() == 0 })
}

func TestRedlockRefusesEphemeralAndEvenServerCounts(t *testing.T) {
	ss := threeServers(t)
	r := redlockOver(t, ss)
	if _, err := r.Lock(bg, "k", Ephemeral()); !errors.Is(err, ErrRefused) {
		t.Fatalf("ephemeral Redlock: %v, want ErrRefused", err)
	}
	for _, s := range ss {
		if s.owners(t, "k") != nil {
			t.Fatal("a refused ephemeral Redlock holds something")
		}
	}
	if _, err := NewRedlock(ss[0].rdb, ss[1].rdb); !errors.Is(err, ErrRefused) {
		t.Fatalf("two servers: %v, want ErrRefused", err)
	}
}

func TestRedlockKeepsItsHoldWithOneServerPausedOrKilled(t *testing.T) {
	ss := threeServers(t)
	r := redlockOver(t, ss)
	l, err := r.Lock(bg, "k", WithTTL(600*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// One server paused past the lease: the other two keep the majority.
	ss[2].pauseWrites(t, 1500*time.Millisecond)
	time.Sleep(1200 * time.Millisecond)
	if !l.Held() {
		t.Fatalf("lost with one server of three paused: %v", l.Lost())
	}
	waitFor(t, "the pause ends", 3*time.Second, func() bool {
		return ss[2].rdb.Do(bg, "LOCK.RENEW", "probe", "o", "1000").Err() != nil
	})
	// The paused server let the hold's lease end there: with another one
	// killed, only one server of three holds it, and the hold is lost.
	ss[0].stop()
	select {
	case <-l.Context().Done():
	case <-time.After(3 * time.Second):
		t.Fatal("no loss with a majority gone")
	}
	if !errors.Is(l.Lost(), ErrLost) {
		t.Fatalf("loss %v", l.Lost())
	}
	_ = l.Release(bg)
	// With one server of three down a new hold takes the two left, and
	// keeps them.
	l2, err := r.Lock(bg, "k", WithTTL(600*time.Millisecond))
	if err != nil {
		t.Fatalf("a new hold with one server of three down: %v", err)
	}
	time.Sleep(1200 * time.Millisecond)
	if !l2.Held() {
		t.Fatalf("lost with one server of three killed: %v", l2.Lost())
	}
	// A second one down: no majority, the hold is lost.
	ss[1].stop()
	select {
	case <-l2.Context().Done():
	case <-time.After(3 * time.Second):
		t.Fatal("no loss with two servers of three down")
	}
	if _, err := r.TryLock(bg, "k", WithTTL(time.Second)); err == nil {
		t.Fatal("a hold taken on one server of three")
	}
}
