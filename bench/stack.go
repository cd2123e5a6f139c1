package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// adminToken is the operator token of the creditd the bench starts.
const adminToken = "bench-admin-token-of-at-least-32-characters"

// services finds Redis and Postgres: REDIS_URL / DATABASE_URL when both are
// set, else what scripts/services.sh answers (it starts private ones when no
// local server answers).
func services(root string) (redisURL, dbURL string, err error) {
	redisURL, dbURL = os.Getenv("REDIS_URL"), os.Getenv("DATABASE_URL")
	if redisURL != "" && dbURL != "" {
		return redisURL, dbURL, nil
	}
	cmd := exec.Command(filepath.Join(root, "scripts", "services.sh"))
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", "", fmt.Errorf("scripts/services.sh: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "export "), "=")
		if !ok {
			continue
		}
		v = strings.Trim(v, `'"`)
		switch k {
		case "REDIS_URL":
			if redisURL == "" {
				redisURL = v
			}
		case "DATABASE_URL":
			if dbURL == "" {
				dbURL = v
			}
		}
	}
	if redisURL == "" || dbURL == "" || redisURL == "embedded" {
		return "", "", fmt.Errorf("scripts/services.sh gave no usable REDIS_URL/DATABASE_URL: %q", out)
	}
	return redisURL, dbURL, nil
}

// moduleRoot is the nearest directory up from the working directory that
// reservations go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// createDatabase makes a fresh database next to base and returns its URL.
func createDatabase(ctx context.Context, base, name string) (string, error) {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", fmt.Errorf("connect %s: %w", redact(base), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	u.Path = "/" + name
	return u.String(), nil
}

// dropDatabase removes a database the bench made.
func dropDatabase(ctx context.Context, base, name string) error {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	return err
}

// scenarioDatabase creates the fresh database of a scenario's own stack,
// named after the run and suffix, and returns its name, its URL and the
// func that drops it (or, under -keep, logs that it was kept).
func (b *Bench) scenarioDatabase(ctx context.Context, scenario, suffix string) (name, dbURL string, drop func(), err error) {
	name = b.runID + suffix
	if dbURL, err = createDatabase(ctx, b.baseDB, name); err != nil {
		return "", "", nil, err
	}
	return name, dbURL, func() {
		if b.o.Keep {
			logf("%s: kept database %s (its Redis is gone)", scenario, name)
			return
		}
		if err := dropDatabase(context.Background(), b.baseDB, name); err != nil {
			logf("%s: drop database: %v", scenario, err)
		}
	}, nil
}

// creditdEnv is the environment of a creditd the bench starts: its Redis,
// database, key prefix, address and instance name, then extra settings.
func creditdEnv(redisURL, dbURL, prefix, addr, instance string, extra ...string) []string {
	return append([]string{
		"REDIS_URL=" + redisURL, "DATABASE_URL=" + dbURL, "CREDITD_REDIS_PREFIX=" + prefix,
		"CREDITD_ADDR=" + addr, "CREDITD_ADMIN_TOKEN=" + adminToken, "LOG_LEVEL=warn", "CREDITD_INSTANCE=" + instance,
	}, extra...)
}

func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparseable url)"
	}
	return p.Redacted()
}

// freeAddr is a loopback address nothing listens on right now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// buildCreditd builds cmd/creditd into dir.
func buildCreditd(root, dir string) (string, error) {
	bin := filepath.Join(dir, "creditd")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/creditd")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/creditd: %v\n%s", err, out)
	}
	return bin, nil
}

// Proc is a child process the bench started (creditd, the ceiling server).
type Proc struct {
	Name string
	Addr string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// startProc runs bin with args and env added to ours, logs to logPath, and
// waits until GET http://addr/healthz answers 200.
func startProc(name, bin string, args, env []string, addr, logPath string) (*Proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, Addr: addr, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited at start (%v):\n%s", name, p.err, tail(logPath, 2000))
		default:
		}
		res, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return p, nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.Stop()
	return nil, fmt.Errorf("%s did not answer /healthz within 30 s:\n%s", name, tail(logPath, 2000))
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Stop sends SIGTERM and waits up to 20 s, then SIGKILL.
func (p *Proc) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// API is a small JSON client for setup and checks (not the load path).
type API struct {
	Base string
	Key  string
	HTTP *http.Client
}

// Answer is a decoded HTTP answer.
type Answer struct {
	Status int
	Raw    []byte
}

// Decode unmarshals the body into v.
func (a Answer) Decode(v any) error { return json.Unmarshal(a.Raw, v) }

func (a Answer) String() string {
	s := string(a.Raw)
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return fmt.Sprintf("%d %s", a.Status, s)
}

// Call sends one request; headers are name, value pairs.
func (c *API) Call(method, path string, body any, headers ...string) (Answer, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return Answer{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.Base+path, rd)
	if err != nil {
		return Answer{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Key != "" {
		req.Header.Set("X-API-Key", c.Key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := c.HTTP.Do(req)
	if err != nil {
		return Answer{}, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	return Answer{Status: res.StatusCode, Raw: raw}, err
}

// Expect is Call that wants one status.
func (c *API) Expect(want int, method, path string, body any, headers ...string) (Answer, error) {
	a, err := c.Call(method, path, body, headers...)
	if err != nil {
		return a, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if a.Status != want {
		return a, fmt.Errorf("%s %s: want %d, got %s", method, path, want, a)
	}
	return a, nil
}

// Metrics reads GET /metrics as series -> value ("name{labels}" as written).
func (c *API) Metrics() (map[string]float64, error) {
	res, err := c.HTTP.Get(c.Base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// parallel runs f(i) for i in [0, n) on up to width goroutines and returns
// the first error.
func parallel(n, width int, f func(i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next := make(chan int)
	for w := 0; w < width; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		mu.Lock()
		stop := first != nil
		mu.Unlock()
		if stop {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// redisInfo reads one field of INFO section.
func redisInfo(ctx context.Context, rdb *redis.Client, section, field string) (string, error) {
	s, err := rdb.Info(ctx, section).Result()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(s, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == field {
			return v, nil
		}
	}
	return "", fmt.Errorf("INFO %s has no %s", section, field)
}

func redisUsedMemory(ctx context.Context, rdb *redis.Client) (int64, error) {
	v, err := redisInfo(ctx, rdb, "memory", "used_memory")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(v, 10, 64)
}

// deletePrefix unlinks every key of a bench prefix ("{prefix:..." and
// "{prefix}...").
func deletePrefix(ctx context.Context, rdb *redis.Client, prefix string) (int, error) {
	n := 0
	for _, pat := range []string{"{" + prefix + ":*", "{" + prefix + "}*"} {
		iter := rdb.Scan(ctx, 0, pat, 5000).Iterator()
		batch := make([]string, 0, 1000)
		flush := func() error {
			if len(batch) == 0 {
				return nil
			}
			err := rdb.Unlink(ctx, batch...).Err()
			n += len(batch)
			batch = batch[:0]
			return err
		}
		for iter.Next(ctx) {
			batch = append(batch, iter.Val())
			if len(batch) == cap(batch) {
				if err := flush(); err != nil {
					return n, err
				}
			}
		}
		if err := iter.Err(); err != nil {
			return n, err
		}
		if err := flush(); err != nil {
			return n, err
		}
	}
	return n, nil
}
