package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/internal/pgserver"
)

// Fleet is the fleet a run started with scripts/fleet.sh in a data
// directory of its own, so it never meets a user's `make fleet`.
type Fleet struct {
	root    string
	dataDir string // CREDITD_DATA_DIR
	dir     string // dataDir/fleet
	URL     string // HAProxy
	Nodes   []string
	Seeds   []string
	Token   string
	DBURL   string
	// PG is the run's own Postgres, which the outage stops and starts.
	PG *pgserver.Server
	// Bin is the creditd binary the next start or start-node runs (""
	// bin/creditd): an upgrade run switches it from the old release's to
	// the new one's between nodes.
	Bin string
	// Env is added to the environment of the nodes started from now on
	// (an upgrade run's new release gets its rolling-upgrade settings).
	Env     []string
	started bool
}

// env is the environment of every scripts/fleet.sh call.
func (f *Fleet) env() []string {
	env := append(os.Environ(), "CREDITD_DATA_DIR="+f.dataDir, "DATABASE_URL="+f.DBURL)
	if f.Bin != "" {
		env = append(env, "CREDITD_BIN="+f.Bin)
	}
	return append(env, f.Env...)
}

// bin is the binary the fleet's nodes run now.
func (f *Fleet) bin() string {
	if f.Bin != "" {
		return f.Bin
	}
	return filepath.Join(f.root, "bin", "creditd")
}

// script runs a repository script, its output appended to the fleet's
// chaos-scripts.log.
func (f *Fleet) script(ctx context.Context, env []string, name string, args ...string) error {
	lf, err := os.OpenFile(filepath.Join(f.dataDir, "chaos-scripts.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer lf.Close()
	fmt.Fprintf(lf, "== %s %s %s\n", time.Now().UTC().Format(time.RFC3339), name, strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, filepath.Join(f.root, "scripts", name), args...)
	cmd.Dir = f.root
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("scripts/%s %s: %w (log: %s)", name, strings.Join(args, " "), err, lf.Name())
	}
	return nil
}

// startFleet starts a private Postgres (never the machine's shared one: the
// run stops its Postgres for an outage), makes the run's database on it and
// starts the fleet on that, HAProxy on a free port.
func startFleet(ctx context.Context, root, stamp string) (*Fleet, error) {
	return startFleetOf(ctx, root, stamp, "")
}

// startFleetOf is startFleet with every node running binary bin (""
// bin/creditd).
func startFleetOf(ctx context.Context, root, stamp, bin string) (*Fleet, error) {
	dataDir, err := os.MkdirTemp("", "creditd-chaos-")
	if err != nil {
		return nil, err
	}
	f := &Fleet{root: root, dataDir: dataDir, dir: filepath.Join(dataDir, "fleet"), Bin: bin}
	// max_connections: 3 nodes x persist.DefaultMaxConns (16), the
	// harness's own connections and room for a restarted node whose old
	// connections Postgres has not yet noticed gone.
	f.PG, err = pgserver.New(ctx, 200)
	if err != nil {
		return f, fmt.Errorf("private postgres: %w", err)
	}
	if f.DBURL, err = createDatabase(ctx, f.PG.URL(), "creditd_chaos_"+stamp); err != nil {
		return f, err
	}
	port, err := freePort()
	if err != nil {
		return f, err
	}
	f.started = true
	if err := f.script(ctx, append(f.env(), "FLEET_PORT="+strconv.Itoa(port)), "fleet.sh", "start"); err != nil {
		return f, err
	}
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(f.dir, name))
		return strings.TrimSpace(string(b))
	}
	f.URL, f.Token = read("url"), read("admin-token")
	f.Seeds = strings.Split(read("redis/seeds"), ",")
	for i := 1; i <= 3; i++ {
		f.Nodes = append(f.Nodes, read(fmt.Sprintf("creditd-%d.addr", i)))
	}
	if f.URL == "" || f.Token == "" || len(f.Seeds) != 6 || f.Nodes[2] == "" {
		return f, fmt.Errorf("fleet started but its files in %s are incomplete", f.dir)
	}
	return f, nil
}

// stop stops the fleet by its pidfiles and its Postgres; purge also
// deletes their data (a failing run keeps both: start the kept Postgres
// with `postgres -D DIR/data -p PORT` as the postgres user to look).
func (f *Fleet) stop(purge bool) {
	if f.started {
		if err := f.script(context.Background(), f.env(), "fleet.sh", "stop"); err != nil {
			logf("stop: %v", err)
		}
	}
	if !purge {
		f.PG.Stop()
		logf("kept %s, and database %s in %s", f.dataDir, dbName(f.DBURL), f.pgDir())
		return
	}
	f.PG.Remove()
	_ = os.RemoveAll(f.dataDir)
}

// pgDir is the private Postgres' directory ("" without one).
func (f *Fleet) pgDir() string {
	if f.PG == nil {
		return ""
	}
	return f.PG.Dir
}

// createDatabase makes database name on the server of base and returns
// its URL.
func createDatabase(ctx context.Context, base, name string) (string, error) {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", fmt.Errorf("postgres: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return withDatabase(base, name)
}

// withDatabase is URL u naming database name instead.
func withDatabase(u, name string) (string, error) {
	p, err := url.Parse(u)
	if err != nil {
		return "", err
	}
	p.Path = "/" + name
	return p.String(), nil
}

// dbName is the database of a URL.
func dbName(u string) string {
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		return ""
	}
	return cfg.Database
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// pidOf reads a pidfile.
func pidOf(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// killHard sends SIGKILL to the pid in pidfile and waits until it is gone
// (or a zombie: its parent, init, may reap it late).
func killHard(pidfile string) (int, error) {
	pid, err := pidOf(pidfile)
	if err != nil {
		return 0, err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return pid, fmt.Errorf("kill -9 %d: %w", pid, err)
	}
	for i := 0; i < 100; i++ {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || procState(string(b)) == "Z" {
			return pid, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return pid, fmt.Errorf("pid %d still runs 2 s after kill -9", pid)
}

// procState is the state field of a /proc/PID/stat line (after the
// parenthesised command name, which may hold spaces).
func procState(stat string) string {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return ""
	}
	fields := strings.Fields(stat[i+1:])
	if len(fields) == 0 {
		return ""
	}
	return fields[0]
}

// killNode kills creditd node n (1-based) with SIGKILL.
func (f *Fleet) killNode(n int) (int, error) {
	return killHard(filepath.Join(f.dir, fmt.Sprintf("creditd-%d.pid", n)))
}

// startNode starts node n again (scripts/fleet.sh start-node), waiting
// until it is ready.
func (f *Fleet) startNode(ctx context.Context, n int) error {
	return f.script(ctx, f.env(), "fleet.sh", "start-node", strconv.Itoa(n))
}

// stopNode stops node n gracefully (scripts/fleet.sh stop-node: SIGTERM,
// then waits for the process to exit).
func (f *Fleet) stopNode(ctx context.Context, n int) error {
	return f.script(ctx, f.env(), "fleet.sh", "stop-node", strconv.Itoa(n))
}

// ClusterNode is one line of CLUSTER NODES.
type ClusterNode struct {
	ID       string
	Addr     string // host:port
	Flags    []string
	MasterID string
	Slots    []string
}

// has reports whether the node carries flag.
func (n ClusterNode) has(flag string) bool {
	for _, f := range n.Flags {
		if f == flag {
			return true
		}
	}
	return false
}

// parseClusterNodes parses CLUSTER NODES output.
func parseClusterNodes(s string) []ClusterNode {
	var out []ClusterNode
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 {
			continue
		}
		addr := fields[1]
		if i := strings.IndexByte(addr, '@'); i >= 0 {
			addr = addr[:i]
		}
		n := ClusterNode{ID: fields[0], Addr: addr, Flags: strings.Split(fields[2], ","), MasterID: fields[3]}
		if len(fields) > 8 {
			n.Slots = fields[8:]
		}
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out
}

// redisAt is a short-lived client of one cluster node.
func redisAt(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: 2 * time.Second,
		WriteTimeout: 2 * time.Second, MaxRetries: -1, PoolSize: 2})
}

// clusterView is CLUSTER NODES as one live node (not in skip) sees it.
func (f *Fleet) clusterView(ctx context.Context, skip string) ([]ClusterNode, string, error) {
	var last error
	for _, a := range f.Seeds {
		if a == skip {
			continue
		}
		c := redisAt(a)
		s, err := c.ClusterNodes(ctx).Result()
		c.Close()
		if err == nil {
			return parseClusterNodes(s), a, nil
		}
		last = err
	}
	return nil, "", fmt.Errorf("no cluster node answers: %v", last)
}

// clusterOK: every node but skip reports cluster_state:ok.
func (f *Fleet) clusterOK(ctx context.Context, skip string) bool {
	for _, a := range f.Seeds {
		if a == skip {
			continue
		}
		c := redisAt(a)
		s, err := c.ClusterInfo(ctx).Result()
		c.Close()
		if err != nil || !strings.Contains(s, "cluster_state:ok") {
			return false
		}
	}
	return true
}

// pickMaster is the serving master to kill in cycle i and its in-sync
// replica to promote: the masters in the order of their first slot, the
// i-th modulo their number (so three cycles fail over each shard once,
// whichever node serves it by then), else the next one with a replica.
func pickMaster(nodes []ClusterNode, i int) (master, replica ClusterNode, ok bool) {
	var masters []ClusterNode
	for _, n := range nodes {
		if n.has("master") && !n.has("fail") && !n.has("fail?") && len(n.Slots) > 0 {
			masters = append(masters, n)
		}
	}
	sort.Slice(masters, func(a, b int) bool { return firstSlot(masters[a]) < firstSlot(masters[b]) })
	for k := range masters {
		m := masters[(i+k)%len(masters)]
		for _, n := range nodes {
			if n.MasterID == m.ID && n.has("slave") && !n.has("fail") && !n.has("fail?") {
				return m, n, true
			}
		}
	}
	return ClusterNode{}, ClusterNode{}, false
}

// firstSlot is the lowest slot a node serves (its first range's start).
func firstSlot(n ClusterNode) int {
	lowest := 1 << 30
	for _, r := range n.Slots {
		if r == "" || r[0] == '[' { // a slot being migrated
			continue
		}
		start, _, _ := strings.Cut(r, "-")
		if v, err := strconv.Atoi(start); err == nil && v < lowest {
			lowest = v
		}
	}
	return lowest
}

// replicaSynced: the node at addr is a replica whose link to its master
// is up.
func replicaSynced(ctx context.Context, addr string) bool {
	c := redisAt(addr)
	defer c.Close()
	s, err := c.Info(ctx, "replication").Result()
	return err == nil && strings.Contains(s, "role:slave") && strings.Contains(s, "master_link_status:up")
}

// waitFor polls cond every 100 ms until it holds or d passes.
func waitFor(ctx context.Context, d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// port is the port of host:port.
func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// Failover is one Redis master kill and what followed.
type Failover struct {
	Master      string    `json:"master"`
	MasterPid   int       `json:"master_pid"`
	Replica     string    `json:"replica"`
	Killed      time.Time `json:"killed"`
	Promoted    time.Time `json:"promoted"`
	Restarted   time.Time `json:"restarted"`
	Rejoined    time.Time `json:"rejoined"`
	PromotedOK  bool      `json:"promoted_ok"`
	RejoinedOK  bool      `json:"rejoined_as_replica"`
	ClusterOKAt time.Time `json:"cluster_ok"`
	// ReplicaStall is how long the replica was stopped (SIGSTOP) right
	// before the master's kill, so that the master dies with writes no
	// replica has: the failover loses them for certain (0: not stalled).
	ReplicaStall float64 `json:"replica_stall_s,omitempty"`
	// Shards are the masters and their slots as the kill found them;
	// Dead is the index of the killed master's.
	Shards []Shard `json:"shards"`
	Dead   int     `json:"dead_shard"`
	// Readiness is every live node's /readyz and the balancer's, polled
	// from just before the kill until the old master rejoined.
	Readiness []ReadyPoll `json:"readiness"`
	// Avail is each shard's availability during the promotion (from the
	// kill to the replica serving), analyseFailover's.
	Avail []ShardAvail `json:"availability_during_promotion"`
}

// failMaster kills -9 the master chosen for cycle i, waits for its
// replica's promotion and cluster_state:ok, restarts the killed
// redis-server and waits until it is an in-sync replica; every step goes
// on the timeline.
//
// With stall > 0 the replica is stopped (SIGSTOP) for stall before the
// kill and continued right after it: the master keeps applying (and the
// persister copying) writes the replica never gets, the replica-lag case
// of a real failover, made certain instead of a few milliseconds' chance.
func (f *Fleet) failMaster(ctx context.Context, i int, stall time.Duration, tl *Timeline) (Failover, error) {
	var fo Failover
	nodes, _, err := f.clusterView(ctx, "")
	if err != nil {
		return fo, err
	}
	m, r, ok := pickMaster(nodes, i)
	if !ok {
		return fo, fmt.Errorf("no master with an in-sync replica to fail over")
	}
	fo.Master, fo.Replica = m.Addr, r.Addr
	fo.Shards, fo.Dead = shardsOf(nodes), -1
	for i, s := range fo.Shards {
		if s.Master == m.Addr {
			fo.Dead = i
		}
	}
	redisDir := filepath.Join(f.dir, "redis")
	if stall > 0 {
		// A stopped replica alone loses nothing: on loopback the kernel
		// still delivers what the master had written to the socket. So the
		// replica is stopped (it cannot reconnect) and the master drops its
		// link (CLIENT KILL TYPE replica discards the unsent stream).
		rpid, err := pidOf(filepath.Join(redisDir, "node-"+port(r.Addr)+".pid"))
		if err != nil {
			return fo, err
		}
		if err := syscall.Kill(rpid, syscall.SIGSTOP); err != nil {
			return fo, fmt.Errorf("stop replica %s: %w", r.Addr, err)
		}
		defer func() { _ = syscall.Kill(rpid, syscall.SIGCONT) }()
		mc := redisAt(m.Addr)
		n, err := mc.ClientKillByFilter(ctx, "TYPE", "replica").Result()
		mc.Close()
		if err != nil {
			return fo, fmt.Errorf("CLIENT KILL TYPE replica on %s: %w", m.Addr, err)
		}
		tl.add("replica %s stopped (SIGSTOP, pid %d) and its link dropped by the master (%d link): the master's writes for the next %s reach no replica", r.Addr, rpid, n, stall)
		sleepCtx(ctx, stall)
		fo.ReplicaStall = stall.Seconds()
	}
	fo.MasterPid, err = killHard(filepath.Join(redisDir, "node-"+port(m.Addr)+".pid"))
	fo.Killed = time.Now()
	if err != nil {
		return fo, err
	}
	if stall > 0 {
		rpid, _ := pidOf(filepath.Join(redisDir, "node-"+port(r.Addr)+".pid"))
		if err := syscall.Kill(rpid, syscall.SIGCONT); err != nil {
			return fo, fmt.Errorf("continue replica %s: %w", r.Addr, err)
		}
		tl.add("replica %s continued (SIGCONT) right after the kill", r.Addr)
	}
	tl.add("kill -9 redis master %s (pid %d, slots %s); its replica is %s", m.Addr, fo.MasterPid, strings.Join(m.Slots, " "), r.Addr)
	fo.PromotedOK = waitFor(ctx, 60*time.Second, func() bool {
		view, _, err := f.clusterView(ctx, m.Addr)
		if err != nil {
			return false
		}
		for _, n := range view {
			if n.ID == r.ID && n.has("master") && len(n.Slots) > 0 {
				return true
			}
		}
		return false
	})
	fo.Promoted = time.Now()
	if !fo.PromotedOK {
		tl.add("replica %s NOT promoted within 60 s", r.Addr)
		return fo, fmt.Errorf("replica %s of killed master %s not promoted within 60 s", r.Addr, m.Addr)
	}
	tl.add("replica %s promoted to master (%.1f s after the kill)", r.Addr, fo.Promoted.Sub(fo.Killed).Seconds())
	if waitFor(ctx, 30*time.Second, func() bool { return f.clusterOK(ctx, m.Addr) }) {
		fo.ClusterOKAt = time.Now()
		tl.add("cluster_state:ok on the 5 live nodes")
	}
	if err := f.script(ctx, f.env(), "redis-cluster.sh", "restart-node", redisDir, port(m.Addr)); err != nil {
		return fo, err
	}
	fo.Restarted = time.Now()
	tl.add("redis-server %s started again (scripts/redis-cluster.sh restart-node)", m.Addr)
	fo.RejoinedOK = waitFor(ctx, 60*time.Second, func() bool { return replicaSynced(ctx, m.Addr) && f.clusterOK(ctx, "") })
	fo.Rejoined = time.Now()
	if !fo.RejoinedOK {
		tl.add("%s did NOT rejoin as an in-sync replica within 60 s", m.Addr)
		return fo, fmt.Errorf("%s did not rejoin as an in-sync replica within 60 s", m.Addr)
	}
	tl.add("%s rejoined as a replica, link up; cluster_state:ok on all 6 nodes", m.Addr)
	return fo, nil
}

// stopFor stops the fleet at the end of run r: its data goes when r passed
// and keep is off; otherwise r says where it was kept.
func (f *Fleet) stopFor(r *RunResult, keep bool) {
	purge := r.Pass() && !keep
	f.stop(purge)
	if !purge {
		r.Kept = fmt.Sprintf("data %s, database %s in the private Postgres %s", f.dataDir, dbName(f.DBURL), f.pgDir())
	}
}
