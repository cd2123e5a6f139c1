// Package pgserver runs a private PostgreSQL cluster that a test or the
// chaos harness can stop and start again (issue 25): initdb'd in a new
// temporary directory, on a free port, trust auth, run as the postgres
// system user when the caller is root (initdb refuses root). It must never
// be pointed at the machine's shared server, which others use.
package pgserver

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is one private cluster. Stop ends it as `pg_ctl stop -m immediate`
// does (every backend ends at once, nothing is checkpointed); Start brings
// it back (crash recovery replays its WAL).
type Server struct {
	Port int
	// Dir holds the cluster's data; Remove deletes it.
	Dir  string
	bin  string
	cred *syscall.Credential
	// maxConns is max_connections.
	maxConns int
	cmd      *exec.Cmd
	done     chan struct{}
}

// postgresBin finds the directory of initdb and postgres: PATH first, then
// Debian's /usr/lib/postgresql/<version>/bin, newest version first.
func postgresBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	return "", fmt.Errorf("initdb not found (make test installs PostgreSQL: apt-get install postgresql)")
}

// New initdbs a cluster in a new temporary directory and starts it on a
// free port; maxConns is its max_connections. On an error the caller still
// Removes what it returns.
func New(ctx context.Context, maxConns int) (*Server, error) {
	bin, err := postgresBin()
	if err != nil {
		return nil, err
	}
	// Not under a test's or a run's own directory: their parents are root's
	// alone (0700), and the postgres user must reach this one.
	dir, err := os.MkdirTemp("", "creditd-pg-")
	if err != nil {
		return nil, err
	}
	p := &Server{Dir: dir, bin: bin, maxConns: maxConns}
	if p.Port, err = freePort(); err != nil {
		return p, err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return p, fmt.Errorf("running as root needs the postgres user for initdb: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return p, err
		}
	}
	initdb := p.command(filepath.Join(bin, "initdb"), "-D", p.data(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale")
	if out, err := initdb.CombinedOutput(); err != nil {
		return p, fmt.Errorf("initdb: %w: %s", err, out)
	}
	return p, p.Start(ctx)
}

func (p *Server) data() string { return filepath.Join(p.Dir, "data") }

func (p *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = "/"
	// Its own process group: a Ctrl-C to the caller reaches the caller
	// alone, which stops Postgres itself (immediate) on the way out.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Setpgid: true}
	return cmd
}

// URL is a connection URL of the server's postgres database.
func (p *Server) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.Port)
}

// Start starts the server on its port and directory (again, after stop:
// crash recovery replays its WAL) and waits until it answers a query, for
// at most 60 s.
func (p *Server) Start(ctx context.Context) error {
	logf, err := os.OpenFile(filepath.Join(os.TempDir(), filepath.Base(p.Dir)+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	p.cmd = p.command(filepath.Join(p.bin, "postgres"), "-D", p.data(), "-p", strconv.Itoa(p.Port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+p.Dir, "-c", "fsync=off",
		"-c", "max_connections="+strconv.Itoa(p.maxConns))
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	p.done = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { _ = c.Wait(); close(done) }(p.cmd, p.done)
	deadline := time.Now().Add(60 * time.Second)
	for {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(qctx, p.URL())
		if err == nil {
			err = conn.QueryRow(qctx, `SELECT 1`).Scan(new(int))
			_ = conn.Close(qctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("postgres on port %d exited at start (log %s)", p.Port, logf.Name())
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("postgres on port %d not ready: %v", p.Port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops the server as `pg_ctl stop -m immediate` does (SIGQUIT to the
// postmaster) and waits until it has exited (SIGKILL after 10 s).
func (p *Server) Stop() {
	if p == nil || p.cmd == nil || p.cmd.Process == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Remove stops the server and deletes its directory and log.
func (p *Server) Remove() {
	if p == nil {
		return
	}
	p.Stop()
	_ = os.RemoveAll(p.Dir)
	_ = os.Remove(filepath.Join(os.TempDir(), filepath.Base(p.Dir)+".log"))
}

// freePort is a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
