// Package testenv starts and connects the real services tests need: a fresh
// Postgres database and a fresh Redis key prefix per test (or a private
// redis-server on a free port for crash tests). It is the one place that
// knows how tests reach Redis and Postgres.
//
// Environment:
//   - TEST_REDIS_URL: a redis:// URL (default redis://127.0.0.1:6379/0);
//   - TEST_REDIS_CLUSTER: a comma list of cluster seeds; when set, Redis
//     returns a cluster client and the suite runs against Redis Cluster;
//   - TEST_DATABASE_URL: a server to create databases on
//     (default postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable).
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// RandomSuffix is a short random hex string for unique names.
func RandomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ReplicaAckTimeout is the replica acknowledgement timeout of every creditd
// a test runs (app.Config.ReplicaAckTimeout, CREDITD_REPLICA_ACK_TIMEOUT).
// Production's 50 ms (lua.DefaultReplicaAckTimeout) assumes a replica with
// a core of its own; on a shared test machine a replica waits tens of ms
// for a core now and then (1 WAIT in 30,000 ran out at 50 ms with the load
// average at 10-14 on 2 cores), which would turn a test's money call on the
// cluster with replicas into a 503. A wait that runs out is still a 503: a
// test that stalls its replica (RedisServer.Pause) sees it after this long.
const ReplicaAckTimeout = time.Second

// RedisURL is the single-Redis URL tests use.
func RedisURL() string {
	if u := os.Getenv("TEST_REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

// ClusterSeeds are the Redis Cluster seeds, empty when the suite runs on a
// single Redis.
func ClusterSeeds() []string {
	v := os.Getenv("TEST_REDIS_CLUSTER")
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// Redis returns a client for the suite's Redis (single or cluster) and a
// fresh key prefix; the prefix's keys are deleted when the test ends.
func Redis(t testing.TB) (redis.UniversalClient, string) {
	t.Helper()
	return RedisPool(t, 0)
}

// RedisPool is Redis with a connection pool of poolSize per node (0 keeps
// go-redis' default of 10 per CPU). A whole creditd needs more than the
// default on a small machine: its persister holds one blocking connection
// per outbox partition (32), so cmd/creditd uses 64.
func RedisPool(t testing.TB, poolSize int) (redis.UniversalClient, string) {
	t.Helper()
	var client redis.UniversalClient
	if seeds := ClusterSeeds(); len(seeds) > 0 {
		client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: seeds, PoolSize: poolSize})
	} else {
		opt, err := redis.ParseURL(RedisURL())
		if err != nil {
			t.Fatalf("testenv: bad TEST_REDIS_URL: %v", err)
		}
		if poolSize > 0 {
			opt.PoolSize = poolSize
		}
		client = redis.NewClient(opt)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		t.Fatalf("testenv: redis unreachable (run `make test`, which starts it): %v", err)
	}
	prefix := "t" + RandomSuffix()
	t.Cleanup(func() {
		deletePrefix(client, prefix)
		_ = client.Close()
	})
	return client, prefix
}

func deletePrefix(client redis.UniversalClient, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	del := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, "{"+prefix+":*", 500).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
		return iter.Err()
	}
	switch c := client.(type) {
	case *redis.ClusterClient:
		_ = c.ForEachMaster(ctx, del)
	case *redis.Client:
		_ = del(ctx, c)
	}
}

// DatabaseServerURL is the Postgres server tests create databases on.
func DatabaseServerURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// Database creates a fresh, empty database for the test and returns its URL;
// it is dropped when the test ends.
func Database(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, DatabaseServerURL())
	if err != nil {
		t.Fatalf("testenv: postgres unreachable (run `make test`, which starts it): %v", err)
	}
	name := "creditd_test_" + RandomSuffix()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		_ = admin.Close(ctx)
		t.Fatalf("testenv: create database: %v", err)
	}
	_ = admin.Close(ctx)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, DatabaseServerURL())
		if err != nil {
			return
		}
		defer admin.Close(ctx)
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	u, err := url.Parse(DatabaseServerURL())
	if err != nil {
		t.Fatalf("testenv: bad TEST_DATABASE_URL: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// RedisServer is a private redis-server process a crash test can kill.
type RedisServer struct {
	Addr string
	Dir  string
	args []string
	cmd  *exec.Cmd
	t    testing.TB
}

// StartRedisServer starts redis-server on a free port with its data in a
// temporary directory; extra are more config arguments, such as
// "--appendonly", "yes". It is killed when the test ends.
func StartRedisServer(t testing.TB, extra ...string) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("testenv: redis-server not installed (make test installs it)")
	}
	port := FreePort(t)
	dir := t.TempDir()
	args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--logfile", filepath.Join(dir, "redis.log")}, extra...)
	s := &RedisServer{Addr: fmt.Sprintf("127.0.0.1:%d", port), Dir: dir, args: append([]string{bin}, args...), t: t}
	s.start()
	t.Cleanup(func() { s.Kill() })
	return s
}

func (s *RedisServer) start() {
	s.t.Helper()
	s.cmd = exec.Command(s.args[0], s.args[1:]...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("testenv: start redis-server: %v", err)
	}
	go func(c *exec.Cmd) { _ = c.Wait() }(s.cmd)
	WaitTCP(s.t, s.Addr, 10*time.Second)
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		// A restarted server answers LOADING while it replays its AOF.
		if err := c.Ping(context.Background()).Err(); err == nil {
			return
		} else if time.Now().After(deadline) {
			s.t.Fatalf("testenv: redis-server at %s not ready: %v", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// PID is the server's process id.
func (s *RedisServer) PID() int { return s.cmd.Process.Pid }

// Kill sends SIGKILL to the server and waits for its port to close.
func (s *RedisServer) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(s.cmd.Process.Pid, syscall.SIGKILL)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", s.Addr, 50*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(20 * time.Millisecond)
	}
}

// Restart starts the server again on the same port and directory.
func (s *RedisServer) Restart() { s.start() }

// URL is the server's redis:// URL.
func (s *RedisServer) URL() string { return "redis://" + s.Addr + "/0" }

// WaitTCP waits until addr accepts connections.
func WaitTCP(t testing.TB, addr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: %s not reachable after %s: %v", addr, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// StartRedisReplica starts a private redis-server replicating master and
// waits until master counts it as a connected replica in sync, so a WAIT on
// master can be acknowledged by it.
func StartRedisReplica(t testing.TB, master *RedisServer, extra ...string) *RedisServer {
	t.Helper()
	host, port, err := net.SplitHostPort(master.Addr)
	if err != nil {
		t.Fatalf("testenv: master address %q: %v", master.Addr, err)
	}
	c := redis.NewClient(&redis.Options{Addr: master.Addr})
	defer c.Close()
	// The master's first full sync would wait Redis' default 5 s for more
	// replicas to join (repl-diskless-sync-delay): start it at once.
	if err := c.ConfigSet(context.Background(), "repl-diskless-sync-delay", "0").Err(); err != nil {
		t.Fatalf("testenv: master %s: %v", master.Addr, err)
	}
	r := StartRedisServer(t, append([]string{"--replicaof", host, port}, extra...)...)
	deadline := time.Now().Add(15 * time.Second)
	for {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "connected_slaves:1") && strings.Contains(info, ",state=online,") {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: replica %s of %s not online: %v %s", r.Addr, master.Addr, err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Pause stops the server's process (SIGSTOP) until Resume: it keeps its
// connections open and answers nothing, like a stalled replica. The test's
// end resumes it before the kill.
func (s *RedisServer) Pause() {
	s.t.Helper()
	if err := syscall.Kill(s.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		s.t.Fatalf("testenv: pause redis-server: %v", err)
	}
	s.t.Cleanup(s.Resume)
}

// Resume continues a paused server (SIGCONT).
func (s *RedisServer) Resume() { _ = syscall.Kill(s.cmd.Process.Pid, syscall.SIGCONT) }
