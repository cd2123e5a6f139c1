package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresServer is a private Postgres cluster an outage test can stop and
// start again (issue 25): initdb'd in a temporary directory, on a free port,
// trust auth, run as the postgres system user when the test runs as root
// (initdb refuses root).
type PostgresServer struct {
	Port int
	dir  string
	bin  string
	cred *syscall.Credential
	cmd  *exec.Cmd
	done chan struct{}
	t    testing.TB
}

// postgresBin finds the directory of initdb and postgres: PATH first, then
// Debian's /usr/lib/postgresql/<version>/bin, newest version first.
func postgresBin() (string, bool) {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), true
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], true
		}
	}
	return "", false
}

// StartPostgres initdbs and starts a private Postgres; it is stopped when
// the test ends. The test fails when no initdb is installed (make test
// installs PostgreSQL).
func StartPostgres(t testing.TB) *PostgresServer {
	t.Helper()
	bin, ok := postgresBin()
	if !ok {
		t.Fatalf("testenv: initdb not found (make test installs PostgreSQL)")
	}
	// Not t.TempDir: its parent is root's alone, and the postgres user must
	// reach the directory.
	dir, err := os.MkdirTemp("", "creditd-pg-")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	s := &PostgresServer{Port: FreePort(t), dir: dir, bin: bin, t: t}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("testenv: running as root needs the postgres user for initdb: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(s.dir, uid, gid); err != nil {
			t.Fatalf("testenv: chown %s: %v", s.dir, err)
		}
	}
	initdb := s.command(filepath.Join(bin, "initdb"), "-D", s.data(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale")
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("testenv: initdb: %v\n%s", err, out)
	}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

func (s *PostgresServer) data() string { return filepath.Join(s.dir, "data") }

func (s *PostgresServer) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = "/"
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd
}

// URL is a connection URL of the server's postgres database.
func (s *PostgresServer) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.Port)
}

// Start starts the server on its port and directory and waits until it
// answers a query.
func (s *PostgresServer) Start() {
	s.t.Helper()
	s.cmd = s.command(filepath.Join(s.bin, "postgres"), "-D", s.data(), "-p", strconv.Itoa(s.Port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+s.dir, "-c", "fsync=off",
		"-c", "max_connections=100")
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("testenv: start postgres: %v", err)
	}
	s.done = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { _ = c.Wait(); close(done) }(s.cmd, s.done)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, s.URL())
		if err == nil {
			err = conn.QueryRow(ctx, `SELECT 1`).Scan(new(int))
			_ = conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("testenv: postgres on port %d not ready: %v", s.Port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops the server the way `pg_ctl stop -m immediate` does (SIGQUIT to
// the postmaster: every backend ends at once, nothing is checkpointed) and
// waits until it has exited.
func (s *PostgresServer) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}
