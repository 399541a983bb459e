package redislock

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A real server for a test: LOCK_SERVER (default redis-server) on a free
// loopback port, in a temp dir of its own, with the module LOCK_MODULE
// loaded (default: the repository's release build). Killed when the test
// ends; its log is printed when the test failed.
type server struct {
	addr string
	rdb  *redis.Client
	cmd  *exec.Cmd
	log  string
}

func modulePath(t testing.TB) string {
	p := os.Getenv("LOCK_MODULE")
	if p == "" {
		_, here, _, _ := runtime.Caller(0)
		p = filepath.Join(filepath.Dir(here), "..", "target", "release", "libredislock.so")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("module %s not found: build it first (cargo build --release; make go-test does it)", p)
	}
	return p
}

func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func startServer(t testing.TB, extra ...string) *server {
	t.Helper()
	bin := os.Getenv("LOCK_SERVER")
	if bin == "" {
		bin = "redis-server"
	}
	mod := modulePath(t)
	for attempt := 0; ; attempt++ {
		dir := t.TempDir()
		port := freePort(t)
		log := filepath.Join(dir, "server.log")
		args := append([]string{
			"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--logfile", log,
			"--enable-debug-command", "yes", "--loadmodule", mod,
		}, extra...)
		cmd := exec.Command(bin, args...)
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", bin, err)
		}
		s := &server{addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd, log: log}
		s.rdb = redis.NewClient(&redis.Options{Addr: s.addr, Protocol: 2, PoolSize: 1})
		if s.ready() {
			t.Cleanup(func() {
				s.rdb.Close()
				s.stop()
				if t.Failed() {
					b, _ := os.ReadFile(log)
					t.Logf("server log %s:\n%s", s.addr, b)
				}
			})
			return s
		}
		s.stop()
		if attempt == 3 {
			b, _ := os.ReadFile(log)
			t.Fatalf("server did not start on %s:\n%s", s.addr, b)
		}
	}
}

func (s *server) ready() bool {
	end := time.Now().Add(10 * time.Second)
	for time.Now().Before(end) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := s.rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return true
		}
		if s.cmd.ProcessState != nil {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

func (s *server) stop() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_, _ = s.cmd.Process.Wait()
	}
}

// client is a lock client on s, closed when the test ends.
func (s *server) client(t testing.TB) *Client {
	rdb := redis.NewClient(&redis.Options{Addr: s.addr})
	c := New(rdb)
	t.Cleanup(func() { c.Close(); rdb.Close() })
	return c
}

// owners lists the owners holding key, per LOCK.INFO's holders.
func (s *server) owners(t testing.TB, key string) []string {
	t.Helper()
	v, err := s.rdb.Do(context.Background(), "LOCK.INFO", key).Result()
	if err == redis.Nil {
		return nil
	}
	if err != nil {
		t.Fatalf("LOCK.INFO %s: %v", key, err)
	}
	var out []string
	fields, _ := v.([]any)
	for i := 0; i+1 < len(fields); i += 2 {
		if fields[i] != "holders" {
			continue
		}
		hs, _ := fields[i+1].([]any)
		for _, h := range hs {
			hf, _ := h.([]any)
			for j := 0; j+1 < len(hf); j += 2 {
				if hf[j] == "owner" {
					out = append(out, fmt.Sprint(hf[j+1]))
				}
			}
		}
	}
	return out
}

// waitFor polls cond every 5 ms until it holds, failing after limit.
func waitFor(t testing.TB, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting until %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waiters is how many clients wait on key (LOCK.QUEUE).
func (s *server) waiters(key string) int {
	v, err := s.rdb.Do(context.Background(), "LOCK.QUEUE", key).Slice()
	if err != nil {
		return -1
	}
	return len(v)
}

func (s *server) pauseWrites(t testing.TB, d time.Duration) {
	t.Helper()
	if err := s.rdb.Do(context.Background(), "CLIENT", "PAUSE", d.Milliseconds(), "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
}

// killClients closes every client connection but the test's own.
func (s *server) killClients(t testing.TB) {
	t.Helper()
	me, err := s.rdb.ClientID(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	list, err := s.rdb.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		for _, f := range strings.Fields(line) {
			if id, ok := strings.CutPrefix(f, "id="); ok && id != fmt.Sprint(me) {
				s.rdb.Do(context.Background(), "CLIENT", "KILL", "ID", id)
			}
		}
	}
}
