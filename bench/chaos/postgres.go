package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Postgres is the run's own Postgres cluster (issue 25): initdb'd in a
// directory of its own, on a free port, trust auth, run as the postgres
// system user when the run is root's (initdb refuses root). The run stops
// it (SIGQUIT to the postmaster, `pg_ctl stop -m immediate`: every backend
// ends at once, nothing is checkpointed) and starts it again for its
// outage, so it must never be the machine's shared server, which others use.
type Postgres struct {
	Port int
	dir  string
	bin  string
	cred *syscall.Credential
	cmd  *exec.Cmd
	done chan struct{}
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

// startPostgres initdbs a cluster in a new temporary directory and starts
// it on a free port.
func startPostgres(ctx context.Context) (*Postgres, error) {
	bin, err := postgresBin()
	if err != nil {
		return nil, err
	}
	// Not under the run's data directory: its parent is root's alone (0700),
	// and the postgres user must reach this one.
	dir, err := os.MkdirTemp("", "creditd-chaos-pg-")
	if err != nil {
		return nil, err
	}
	p := &Postgres{dir: dir, bin: bin}
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
	return p, p.start(ctx)
}

func (p *Postgres) data() string { return filepath.Join(p.dir, "data") }

func (p *Postgres) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = "/"
	// Its own process group: a Ctrl-C to `make chaos` reaches the harness,
	// which stops Postgres itself (immediate) on the way out.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Setpgid: true}
	return cmd
}

// URL is a connection URL of the server's postgres database.
func (p *Postgres) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.Port)
}

// start starts the server on its port and directory (again, after stop:
// crash recovery replays its WAL) and waits until it answers a query, for
// at most 60 s.
func (p *Postgres) start(ctx context.Context) error {
	logf, err := os.OpenFile(filepath.Join(os.TempDir(), filepath.Base(p.dir)+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	// max_connections: 3 nodes x persist.DefaultMaxConns (16), the
	// harness's own connections and room for a restarted node whose old
	// connections Postgres has not yet noticed gone.
	p.cmd = p.command(filepath.Join(p.bin, "postgres"), "-D", p.data(), "-p", strconv.Itoa(p.Port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+p.dir, "-c", "fsync=off",
		"-c", "max_connections=200")
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

// stop stops the server as `pg_ctl stop -m immediate` does (SIGQUIT to the
// postmaster) and waits until it has exited (SIGKILL after 10 s).
func (p *Postgres) stop() {
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

// remove stops the server and deletes its directory and log.
func (p *Postgres) remove() {
	if p == nil {
		return
	}
	p.stop()
	_ = os.RemoveAll(p.dir)
	_ = os.Remove(filepath.Join(os.TempDir(), filepath.Base(p.dir)+".log"))
}
