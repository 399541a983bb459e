package redislock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startSentinel starts a Sentinel (the server binary with --sentinel)
// watching master as "mymaster".
func startSentinel(t *testing.T, master *server) string {
	t.Helper()
	bin := os.Getenv("LOCK_SERVER")
	if bin == "" {
		bin = "redis-server"
	}
	dir := t.TempDir()
	port := freePort(t)
	host, mport, _ := strings.Cut(master.addr, ":")
	conf := filepath.Join(dir, "sentinel.conf")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
		"sentinel monitor mymaster %s %s 1\n"+
		"sentinel down-after-milliseconds mymaster 1000\n"+
		"sentinel failover-timeout mymaster 5000\n",
		port, dir, filepath.Join(dir, "sentinel.log"), host, mport)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "sentinel.log"))
			t.Logf("sentinel log:\n%s", b)
		}
	})
	return fmt.Sprintf("127.0.0.1:%d", port)
}

func TestSentinelFailoverClientFollowsThePromotedMaster(t *testing.T) {
	master := startServer(t)
	host, port, _ := strings.Cut(master.addr, ":")
	replica := startServer(t, "--replicaof", host, port)
	waitFor(t, "the replica is in sync", 10*time.Second, func() bool {
		info, _ := replica.rdb.Info(bg, "replication").Result()
		return strings.Contains(info, "master_link_status:up")
	})
	addr := startSentinel(t, master)
	sentinel := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer sentinel.Close()
	waitFor(t, "the Sentinel knows the replica", 15*time.Second, func() bool {
		rs, err := sentinel.Replicas(bg, "mymaster").Result()
		return err == nil && len(rs) == 1
	})
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{addr}})
	defer rdb.Close()
	c := New(rdb)
	defer c.Close()

	l, err := c.Lock(bg, "before", WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got := master.owners(t, "before"); len(got) != 1 {
		t.Fatalf("holders on the master: %v", got)
	}
	_ = l.Release(bg)

	// The Sentinel refuses (NOGOODSLAVE) until it has heard from the
	// replica itself.
	waitFor(t, "the Sentinel starts a failover", 20*time.Second, func() bool {
		err := sentinel.Failover(bg, "mymaster").Err()
		if err != nil && !strings.Contains(err.Error(), "NOGOODSLAVE") {
			t.Fatal(err)
		}
		return err == nil
	})
	waitFor(t, "the replica is promoted and the old master follows it", 20*time.Second, func() bool {
		a, err := sentinel.GetMasterAddrByName(bg, "mymaster").Result()
		info, _ := replica.rdb.Info(bg, "replication").Result()
		old, _ := master.rdb.Info(bg, "replication").Result()
		return err == nil && len(a) == 2 && a[0]+":"+a[1] == replica.addr &&
			strings.Contains(info, "role:master") && strings.Contains(old, "role:slave")
	})
	// Connections to the old master answer READONLY once it follows the
	// new one: each such answer drops them, and a later call asks the
	// Sentinel again.
	var after *Lock
	waitFor(t, "a lock on the new master", 20*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(bg, time.Second)
		defer cancel()
		after, err = c.TryLock(ctx, "after", WithTTL(10*time.Second))
		if err != nil && !errors.Is(err, ErrTransport) && !errors.Is(err, ErrCancelled) {
			t.Fatalf("after the failover: %v", err)
		}
		return err == nil
	})
	if got := replica.owners(t, "after"); len(got) != 1 || got[0] != after.Owner() {
		t.Fatalf("holders on the promoted master: %v", got)
	}
	if err := after.Release(bg); err != nil {
		t.Fatal(err)
	}
}

// startCluster starts three masters with the module and joins them with
// LOCK_CLI (default redis-cli) --cluster create.
func startCluster(t *testing.T) []*server {
	t.Helper()
	var nodes []*server
	var addrs []string
	for range 3 {
		s := startServer(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000")
		nodes = append(nodes, s)
		addrs = append(addrs, s.addr)
	}
	cli := os.Getenv("LOCK_CLI")
	if cli == "" {
		cli = "redis-cli"
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s --cluster create: %v\n%s", cli, err, out)
	}
	for _, n := range nodes {
		waitFor(t, "the cluster is ok on "+n.addr, 15*time.Second, func() bool {
			info, _ := n.rdb.ClusterInfo(bg).Result()
			return strings.Contains(info, "cluster_state:ok")
		})
	}
	return nodes
}

func nodeID(t *testing.T, s *server) string {
	id, err := s.rdb.Do(bg, "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestClusterWaitsFollowAMovedSlot(t *testing.T) {
	nodes := startCluster(t)
	var seeds []string
	for _, n := range nodes {
		seeds = append(seeds, n.addr)
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: seeds})
	defer rdb.Close()
	c := New(rdb)
	defer c.Close()

	// Locks on keys of every node.
	for _, key := range []string{"a", "b", "c", "d", "e", "f"} {
		l, err := c.TryLock(bg, key)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if err := l.Release(bg); err != nil {
			t.Fatal(err)
		}
	}
	// The slot of "k" moves to another node behind the client's back: its
	// next wait is sent to the old node, answered MOVED, and parks on the
	// new one.
	slot, err := nodes[0].rdb.ClusterKeySlot(bg, "k").Result()
	if err != nil {
		t.Fatal(err)
	}
	owner, err := rdb.MasterForKey(bg, "k")
	if err != nil {
		t.Fatal(err)
	}
	var from, to *server
	for _, n := range nodes {
		if n.addr == owner.Options().Addr {
			from = n
		} else if to == nil {
			to = n
		}
	}
	if from == nil {
		t.Fatalf("no node at %s", owner.Options().Addr)
	}
	if err := to.rdb.Do(bg, "LOCK.ACQUIRE", "k", "other", "30000").Err(); err == nil {
		t.Fatal("the new node took a key of a slot it does not serve yet")
	}
	toID := nodeID(t, to)
	for _, n := range nodes {
		if err := n.rdb.Do(bg, "CLUSTER", "SETSLOT", slot, "NODE", toID).Err(); err != nil {
			t.Fatalf("SETSLOT on %s: %v", n.addr, err)
		}
	}
	if err := to.rdb.Do(bg, "LOCK.ACQUIRE", "k", "other", "30000").Err(); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var l *Lock
	go func() {
		var err error
		l, err = c.Lock(bg, "k", WithWait(10*time.Second))
		got <- err
	}()
	waitFor(t, "the wait parks on the slot's new node", 10*time.Second, func() bool { return to.waiters("k") == 1 })
	to.rdb.Do(bg, "LOCK.RELEASE", "k", "other")
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if holders := to.owners(t, "k"); len(holders) != 1 || holders[0] != l.Owner() {
		t.Fatalf("holders on the new node: %v", holders)
	}
	if err := l.Release(bg); err != nil {
		t.Fatal(err)
	}
}
