package main

// `make upgrade-test` (issue 25): a rolling upgrade under load. The fleet
// starts on the previous release's binary, built from its commit out of
// this repository's history (deploy/previous-release, so a clone without
// tags works); then each node in turn is stopped with SIGTERM and started
// again on the new binary while the money load and the checks go on, so
// old and new nodes serve side by side over one Redis Cluster, one outbox
// and one Postgres the first new node migrated. The books are then judged
// as a chaos run's are (verifyBooks), and more strictly on the answers: a
// graceful replacement owes the clients no 5xx but 503, and no dropped
// connection.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// previousReleaseFile names the release an upgrade starts from.
const previousReleaseFile = "deploy/previous-release"

// Release is one side of an upgrade.
type Release struct {
	Name   string `json:"name"`   // the tag, the -from/-to argument or "working tree"
	Commit string `json:"commit"` // full sha (HEAD for the working tree)
	Dirty  bool   `json:"dirty,omitempty"`
	Bin    string `json:"binary"`
	// Version is what `creditd version` of the binary printed.
	Version string `json:"version"`
}

func (r Release) String() string {
	s := r.Name + " (" + short(r.Commit)
	if r.Dirty {
		s += " with uncommitted changes"
	}
	return s + ")"
}

func short(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}

var shaRE = regexp.MustCompile(`^[0-9a-f]{40}$`)

// parseRelease reads previousReleaseFile's text: "tag NAME" and
// "commit SHA" lines, # comments and blank lines ignored.
func parseRelease(text string) (Release, error) {
	var r Release
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		k, v, _ := strings.Cut(line, " ")
		v = strings.TrimSpace(v)
		switch k {
		case "tag":
			r.Name = v
		case "commit":
			r.Commit = v
		default:
			return r, fmt.Errorf("%s: unknown line %q", previousReleaseFile, line)
		}
	}
	if r.Name == "" || !shaRE.MatchString(r.Commit) {
		return r, fmt.Errorf("%s: want a \"tag NAME\" line and a \"commit SHA\" line with the full 40-hex sha", previousReleaseFile)
	}
	return r, nil
}

// git runs git in root and returns its trimmed output.
func git(ctx context.Context, root string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(ee.Stderr)))
		}
		return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// resolveRelease is the release spec names: "" for from is
// previousReleaseFile's, "" for to the working tree, else any commit-ish
// of the repository's history.
func resolveRelease(ctx context.Context, root, spec string, from bool) (Release, error) {
	switch {
	case spec == "" && from:
		b, err := os.ReadFile(filepath.Join(root, previousReleaseFile))
		if err != nil {
			return Release{}, err
		}
		r, err := parseRelease(string(b))
		if err != nil {
			return r, err
		}
		if _, err := git(ctx, root, "cat-file", "-e", r.Commit+"^{commit}"); err != nil {
			return r, fmt.Errorf("%s names commit %s, which this repository's history does not hold (a shallow clone? git fetch --unshallow): %w", previousReleaseFile, r.Commit, err)
		}
		return r, nil
	case spec == "":
		head, err := git(ctx, root, "rev-parse", "HEAD")
		if err != nil {
			return Release{}, err
		}
		st, err := git(ctx, root, "status", "--porcelain", "--untracked-files=no")
		if err != nil {
			return Release{}, err
		}
		return Release{Name: "working tree", Commit: head, Dirty: st != ""}, nil
	}
	sha, err := git(ctx, root, "rev-parse", "--verify", "--quiet", spec+"^{commit}")
	if err != nil {
		return Release{}, fmt.Errorf("%q is no commit of this repository: %w", spec, err)
	}
	return Release{Name: spec, Commit: sha}, nil
}

// buildRelease builds r's creditd into root/.data/upgrade, stamped as
// `make build` stamps it. A commit's binary is built once from `git
// archive` of the commit (the repository's own history: no tag, network or
// second worktree needed) and kept under its sha; the working tree's is
// built every run, since its content has no name.
func buildRelease(ctx context.Context, root string, r *Release) error {
	base := filepath.Join(root, ".data", "upgrade")
	src := root
	if r.Name == "working tree" {
		r.Bin = filepath.Join(base, "tree", "creditd")
	} else {
		r.Bin = filepath.Join(base, r.Commit, "creditd")
	}
	if r.Name != "working tree" {
		if st, err := os.Stat(r.Bin); err == nil && st.Mode()&0o111 != 0 {
			logf("using %s's binary built before: %s", r, r.Bin)
			return r.readVersion(ctx)
		}
		tmp, err := os.MkdirTemp("", "creditd-upgrade-src-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		logf("extracting %s into %s (git archive)", r, tmp)
		arch := exec.CommandContext(ctx, "sh", "-c", `git archive --format=tar "$1" | tar -x -C "$2"`, "sh", r.Commit, tmp)
		arch.Dir = root
		if out, err := arch.CombinedOutput(); err != nil {
			return fmt.Errorf("git archive %s: %v: %s", r.Commit, err, out)
		}
		src = tmp
	}
	if err := os.MkdirAll(filepath.Dir(r.Bin), 0o755); err != nil {
		return err
	}
	version := r.Name
	if r.Name == "working tree" {
		version, _ = git(ctx, root, "describe", "--tags", "--always", "--dirty")
	}
	date, _ := git(ctx, root, "log", "-1", "--date=format-local:%Y-%m-%dT%H:%M:%SZ", "--format=%cd", r.Commit)
	logf("building %s: go build ./cmd/creditd", r)
	gobin := "go"
	if _, err := exec.LookPath("go"); err != nil {
		gobin = "/usr/local/go/bin/go"
	}
	out := r.Bin + ".tmp"
	// -trimpath: the extracted trees live in fresh directories, and with
	// their paths out of the build the cache serves every package two
	// commits share.
	cmd := exec.CommandContext(ctx, gobin, "build", "-trimpath", "-ldflags",
		fmt.Sprintf("-X main.version=%s -X main.commit=%s -X main.date=%s", version, r.Commit, date), "-o", out, "./cmd/creditd")
	cmd.Dir = src
	// An extracted tree has no .git for the toolchain to stamp from.
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false", "TZ=UTC0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build of %s: %v: %s", r, err, b)
	}
	if err := os.Rename(out, r.Bin); err != nil {
		return err
	}
	return r.readVersion(ctx)
}

// readVersion records `creditd version` of the built binary.
func (r *Release) readVersion(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, r.Bin, "version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s version: %v: %s", r.Bin, err, out)
	}
	r.Version = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	return nil
}

// Replacement is one node's turn: stopped on one binary, started on the
// other.
type Replacement struct {
	Node int `json:"node"`
	// Stopping is when SIGTERM went out; StopS how long the node took to
	// exit (its requests in flight and its persister's batch drained);
	// ReadyS from SIGTERM until the new process answered /readyz 200.
	Stopping time.Time `json:"sigterm"`
	StopS    float64   `json:"stop_s"`
	ReadyS   float64   `json:"ready_s"`
	// Commits are the commit each node's log says it runs, after the
	// step; Schema the highest schema_migrations version then.
	Commits []string `json:"node_commits"`
	Schema  int      `json:"schema_version"`
	// Readiness is the other nodes' and HAProxy's /readyz, polled from just
	// before the SIGTERM until the settle after the new node was ready.
	Readiness []ReadyPoll `json:"readiness"`
	// Money and Checks are the answers to requests sent in that window.
	Money  Avail     `json:"money_attempts"`
	Checks Avail     `json:"checks"`
	End    time.Time `json:"end"`
	Error  string    `json:"error,omitempty"`
}

// UpgradeResult is one upgrade run.
type UpgradeResult struct {
	RunResult
	From Release `json:"from"`
	To   Release `json:"to"`
	// SchemaBefore is the schema version the old fleet ran on.
	SchemaBefore int           `json:"schema_version_before"`
	Steps        []Replacement `json:"replacements"`
	// Answers over the whole run, money attempts and checks: what the
	// clients saw.
	Money  Avail `json:"money_attempts"`
	Checks Avail `json:"checks"`
	// No503RetryAfter counts the 503s (creditd's or HAProxy's) without a
	// Retry-After header.
	No503RetryAfter int `json:"503_without_retry_after"`
	// Other5xx counts every 5xx but 503, money or check, creditd's or
	// HAProxy's (Avail files the balancer's apart from creditd's).
	Other5xx int `json:"5xx_other_than_503"`
	// AckByKind counts the acknowledged operations by kind (grant,
	// adjust, consume, reserve, commit).
	AckByKind map[string]int64 `json:"acknowledged_by_kind"`
	// Contract is the new release's `creditd migrate contract`, run under
	// load once every node is new (docs/operations.md "Contract steps"):
	// its output, or why it did not run.
	Contract   string  `json:"contract"`
	ContractS  float64 `json:"contract_seconds"`
	ContractOK bool    `json:"contract_ok"`
}

// runUpgrade is one rolling upgrade from o.From to o.To on a fresh fleet.
func runUpgrade(ctx context.Context, o Options) *UpgradeResult {
	start := time.Now()
	stamp := start.UTC().Format("20060102T150405Z")
	u := &UpgradeResult{RunResult: RunResult{Stamp: stamp, Started: start.UTC(), Options: o}}
	r := &u.RunResult
	r.Options.Root = ""
	tl := &Timeline{start: start}
	defer func() {
		r.Finished = time.Now().UTC()
		r.Timeline = tl.Events
	}()
	var err error
	if u.From, err = resolveRelease(ctx, o.Root, o.From, true); err != nil {
		r.Error = "from: " + err.Error()
		return u
	}
	if u.To, err = resolveRelease(ctx, o.Root, o.To, false); err != nil {
		r.Error = "to: " + err.Error()
		return u
	}
	for _, rel := range []*Release{&u.From, &u.To} {
		if err := buildRelease(ctx, o.Root, rel); err != nil {
			r.Error = "build: " + err.Error()
			return u
		}
		tl.add("binary of %s: %s (%s)", rel, rel.Bin, rel.Version)
	}

	tl.add("starting the fleet on %s (scripts/fleet.sh start, CREDITD_BIN=%s)", u.From, u.From.Bin)
	f, err := startFleetOf(ctx, o.Root, strings.ToLower(stamp), u.From.Bin)
	if f != nil {
		defer f.stopFor(r, o.Keep)
	}
	if err != nil {
		r.Error = "fleet: " + err.Error()
		return u
	}
	u.SchemaBefore = schemaVersion(ctx, f.DBURL)
	tl.add("fleet up on %s: HAProxy %s, nodes %s, schema version %d; node commits %s", u.From, f.URL, strings.Join(f.Nodes, " "), u.SchemaBefore,
		strings.Join(nodeCommits(f), " "))
	r.Setting = fmt.Sprintf("rolling upgrade from %s to %s: scripts/fleet.sh, 3 creditd nodes behind HAProxy (round robin over /readyz, checked every 1 s, "+
		"out after 2 failures), Redis Cluster 3 masters + 3 replicas, the run's own private Postgres; %d workers offering %.0f money operations/s over %d customers, "+
		"%.0f checks/s; each node in turn stopped with SIGTERM and started on the new binary, %s of load between; %s",
		u.From, u.To, o.Workers, o.Rate, o.Customers, o.CheckRate, o.Settle, machine())

	lr, err := startLoad(ctx, o, f, stamp, tl, r)
	if err != nil {
		r.Error = err.Error()
		return u
	}
	r.Setting += "; load mix: " + lr.l.mix()
	if err := upgrade(ctx, o, f, u, tl); err != nil {
		r.Error = "upgrade: " + err.Error()
		tl.add("upgrade stopped: %v", err)
	}
	sleepCtx(ctx, o.Settle)
	lr.stopLoad(ctx, f, tl, r)
	samples := lr.rec.all()
	for i := range u.Steps {
		s := &u.Steps[i]
		win := window(samples, s.Stopping, s.End)
		s.Money = tally(filter(win, func(x Sample) bool { return !x.Check }))
		s.Checks = tally(filter(win, func(x Sample) bool { return x.Check }))
	}
	u.Money = tally(filter(samples, func(x Sample) bool { return !x.Check }))
	u.Checks = tally(filter(samples, func(x Sample) bool { return x.Check }))
	for _, x := range samples {
		if x.Status == 503 && !x.RetryAfter {
			u.No503RetryAfter++
		}
		if x.Status >= 500 && x.Status != 503 {
			u.Other5xx++
		}
	}
	u.AckByKind = map[string]int64{}
	for _, op := range lr.l.ops {
		if op.Status >= 200 && op.Status < 300 {
			u.AckByKind[op.Kind]++
		}
	}
	verifyUpgrade(ctx, u, f, lr)
	tl.add("checks done: %s", r.Verdict())
	return u
}

// upgrade replaces the nodes one at a time, o.Settle of load after each.
func upgrade(ctx context.Context, o Options, f *Fleet, u *UpgradeResult, tl *Timeline) error {
	if !sleepCtx(ctx, o.Settle) {
		return ctx.Err()
	}
	for n := 1; n <= len(f.Nodes); n++ {
		s := Replacement{Node: n}
		poll := pollReady(ctx, f, n)
		// One poll round before the SIGTERM, so a node already out shows.
		sleepCtx(ctx, readyPollEvery)
		s.Stopping = time.Now()
		tl.add("node %d: SIGTERM to its %s process (scripts/fleet.sh stop-node %d)", n, u.From.Name, n)
		err := f.stopNode(ctx, n)
		s.StopS = time.Since(s.Stopping).Seconds()
		tried := err == nil // the new release was started on the node
		if err == nil {
			tl.add("node %d: exited %.1f s after SIGTERM; starting it on %s (scripts/fleet.sh start-node %d, CREDITD_BIN=%s)", n, s.StopS, u.To, n, u.To.Bin)
			// The procedure docs/operations.md gives for a rolling upgrade
			// across migration 023: the new nodes write the old release's
			// records while old nodes still run (a release that does not
			// know the setting ignores it).
			f.Bin, f.Env = u.To.Bin, []string{"CREDITD_FULL_RECORDS=1"}
			err = f.startNode(ctx, n)
			s.ReadyS = time.Since(s.Stopping).Seconds()
		}
		if err == nil {
			s.Schema = schemaVersion(ctx, f.DBURL)
			s.Commits = nodeCommits(f)
			tl.add("node %d: ready on %s %.1f s after SIGTERM; schema version %d; node commits %s", n, u.To.Name, s.ReadyS, s.Schema, strings.Join(s.Commits, " "))
			sleepCtx(ctx, o.Settle)
		}
		if err != nil && tried {
			// The node's last words say why (a schema it refuses, say);
			// read before the restart below appends to its log.
			err = fmt.Errorf("%w; its log ends: %s", err, lastLine(filepath.Join(f.dir, fmt.Sprintf("creditd-%d.log", n))))
			// Put the old release back on the node, as an operator would,
			// so that the fleet is whole for the drain and the books'
			// checks: they still say what the failed step did to the money.
			f.Bin = u.From.Bin
			if e := f.startNode(ctx, n); e == nil {
				tl.add("node %d: the new release did not start; started again on %s", n, u.From.Name)
			} else {
				tl.add("node %d: neither release starts (%v)", n, e)
			}
		}
		s.Readiness = poll.stop()
		s.End = time.Now()
		if err != nil {
			s.Error = err.Error()
		}
		u.Steps = append(u.Steps, s)
		if err != nil {
			return fmt.Errorf("node %d: %w", n, err)
		}
	}
	contract(ctx, f, u, tl)
	sleepCtx(ctx, o.Settle)
	return nil
}

// contract runs the new release's `creditd migrate contract` once every
// node runs it, under the load (issue 30: the contract steps drop what only
// the old release needed, and 033's switches the ledger to its partitioned
// table while the persisters write). A binary without the command skips it.
func contract(ctx context.Context, f *Fleet, u *UpgradeResult, tl *Timeline) {
	help, _ := exec.CommandContext(ctx, u.To.Bin, "migrate", "--help").CombinedOutput()
	if !strings.Contains(string(help), "contract") {
		u.Contract, u.ContractOK = "not run: "+u.To.Name+" has no `creditd migrate contract`", true
		return
	}
	cmd := exec.CommandContext(ctx, u.To.Bin, "migrate", "contract")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+f.DBURL)
	began := time.Now()
	out, err := cmd.CombinedOutput()
	u.ContractS = time.Since(began).Seconds()
	u.Contract, u.ContractOK = strings.TrimSpace(string(out)), err == nil
	tl.add("creditd migrate contract under load: %.1f s, exit %v: %s", u.ContractS, exitCode(err), lastOf(u.Contract))
}

// lastOf is the last line of s.
func lastOf(s string) string {
	lines := strings.Split(s, "\n")
	return lines[len(lines)-1]
}

// lastLine is the last non-empty line of a file, cut to 300 bytes.
func lastLine(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	l := lines[len(lines)-1]
	if len(l) > 300 {
		l = l[:300] + "..."
	}
	return l
}

// schemaVersion is the highest applied migration (-1 when unreadable).
func schemaVersion(ctx context.Context, dbURL string) int {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return -1
	}
	defer conn.Close(ctx)
	var v int
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM schema_migrations").Scan(&v); err != nil {
		return -1
	}
	return v
}

// nodeCommits is the commit each node's latest "creditd starting" log line
// names (short), "?" when its log has none: which binary serves where.
func nodeCommits(f *Fleet) []string {
	var out []string
	for i := range f.Nodes {
		out = append(out, fmt.Sprintf("%d:%s", i+1, short(logCommit(filepath.Join(f.dir, fmt.Sprintf("creditd-%d.log", i+1))))))
	}
	return out
}

// logCommit is the commit of the last "creditd starting" line of a node's
// log (zerolog JSON, cmd/creditd/serve.go).
func logCommit(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "?"
	}
	commit := "?"
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, `"creditd starting"`) {
			continue
		}
		var l struct {
			Commit string `json:"commit"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Commit != "" {
			commit = l.Commit
		}
	}
	return commit
}

// verifyUpgrade records the upgrade run's checks.
func verifyUpgrade(ctx context.Context, u *UpgradeResult, f *Fleet, lr *loadRun) {
	r := &u.RunResult
	var done []string
	var bad []string
	for _, s := range u.Steps {
		if s.Error == "" {
			done = append(done, fmt.Sprintf("node %d: exited %.1f s after SIGTERM, new one ready after %.1f s", s.Node, s.StopS, s.ReadyS))
		} else {
			bad = append(bad, fmt.Sprintf("node %d: %s", s.Node, s.Error))
		}
	}
	r.check("nodes replaced one at a time", len(done) == 3 && len(bad) == 0, true, "%d of 3 nodes stopped with SIGTERM and started on %s%s%s",
		len(done), u.To.Name, listed(done), listed(bad))

	// Side by side: after the first and second steps the fleet ran both
	// binaries; after the last only the new one.
	want := short(u.To.Commit)
	old := short(u.From.Commit)
	var mixed []string
	sideBySide := len(u.Steps) == 3
	for i, s := range u.Steps {
		newN, oldN := 0, 0
		for _, c := range s.Commits {
			_, commit, _ := strings.Cut(c, ":")
			switch commit {
			case want:
				newN++
			case old:
				oldN++
			}
		}
		if want == old {
			newN, oldN = i+1, 2-i // one commit: the step count tells them apart
		}
		mixed = append(mixed, fmt.Sprintf("after node %d: %d new, %d old (%s)", s.Node, newN, oldN, strings.Join(s.Commits, " ")))
		if newN != i+1 || oldN != 2-i {
			sideBySide = false
		}
	}
	r.check("old and new side by side", sideBySide, true, "each node's log names the commit it runs%s", listed(mixed))

	var notReady []string
	for _, s := range u.Steps {
		for _, p := range s.Readiness {
			if !p.Stayed() {
				notReady = append(notReady, fmt.Sprintf("node %d's turn: %s", s.Node, p))
			}
		}
	}
	r.check("readiness through the replacements", len(notReady) == 0 && len(u.Steps) > 0, true,
		"the other nodes' own /readyz and HAProxy's answered 200 at every poll (every %s) from each SIGTERM until %s after the new node was ready%s",
		readyPollEvery, r.Options.Settle, listed(notReady))

	if !verifyBooks(ctx, r, f, lr) {
		return
	}
	c := lr.l.counts
	r.check("no 5xx but 503", u.Other5xx == 0 && c.Other5xx == 0 && c.Balancer5xx == 0, true,
		"%d answers with a 5xx other than 503 (money: %d from creditd, %d from HAProxy; checks: %d from creditd); a graceful replacement cuts no request, so HAProxy's 502/504 count too",
		u.Other5xx, c.Other5xx, c.Balancer5xx, u.Checks.Other5xx)
	r.check("every 503 with Retry-After", u.No503RetryAfter == 0 && u.Money.Bad503 == 0 && u.Checks.Bad503 == 0, true,
		"%d 503s without Retry-After over %d money attempts and %d checks; %d creditd 503s without a problem document (%d money 503s, %d check 503s in all)",
		u.No503RetryAfter, u.Money.N, u.Checks.N, u.Money.Bad503+u.Checks.Bad503, c.Got503, u.Checks.Unavailable+u.Checks.Bad503)
	r.check("no dropped request", c.Transport == 0 && u.Checks.Transport == 0, true,
		"%d money attempts and %d checks without an HTTP answer (the client talks to HAProxy, which outlives every node)", c.Transport, u.Checks.Transport)
	if diffs, pairs, err := rollupDiffs(ctx, f.DBURL, lr.tenant); err != nil {
		r.check("usage rollup", false, true, "reading the rollup: %v", err)
	} else if diffs == nil {
		r.check("usage rollup", true, false, "not checked: the schema has no usage_hourly")
	} else {
		// No pair at all would mean the load consumed nothing: the
		// comparison then proves nothing.
		r.check("usage rollup", len(diffs) == 0 && pairs > 0, true,
			"%d of %d (customer, metric) pairs whose usage_hourly units, cost or count differ from the consumption entries of the ledger: what a persister of one version writes without the other's derived rows shows here%s",
			len(diffs), pairs, listed(diffs))
	}
	r.check("contract steps under load", u.ContractOK, true, "`creditd migrate contract` once every node was new, under the load: %.1f s; %s",
		u.ContractS, lastOf(u.Contract))
	r.check("schema", u.SchemaBefore >= 0, false, "reported: schema version %d on %s, %d after the first new node started (it migrates; the old nodes ran on beside it)",
		u.SchemaBefore, u.From.Name, firstSchema(u.Steps))
}

// rollupSQL compares usage_hourly with the ledger's consumption entries
// per customer and metric, pricing them as migration 020's backfill does
// (persist/migrations/020_usage_rollup.up.sql); it lists the differences.
const rollupSQL = `WITH l AS (
	SELECT customer_id, billable_metric_key AS metric, COALESCE(cost_units, 0)::numeric AS units, overage_mc::numeric - delta AS cost
	FROM ledger_entries WHERE tenant_id = $1 AND type = 'consumption' AND billable_metric_key IS NOT NULL
	UNION ALL
	SELECT e.customer_id, i.item->>'billable_metric_key', (i.item->>'units')::numeric, (i.item->>'cost')::numeric
	FROM ledger_entries e CROSS JOIN LATERAL jsonb_array_elements(e.metadata->'items') AS i(item)
	WHERE e.tenant_id = $1 AND e.type = 'consumption' AND e.billable_metric_key IS NULL
), ls AS (
	SELECT customer_id, metric, sum(units) AS u, sum(cost) AS c, count(*)::numeric AS n FROM l GROUP BY 1, 2
), us AS (
	SELECT customer_id, billable_metric_key AS metric, sum(units)::numeric AS u, sum(cost)::numeric AS c, sum(count)::numeric AS n
	FROM usage_hourly WHERE tenant_id = $1 GROUP BY 1, 2
)
SELECT coalesce(ls.customer_id, us.customer_id)::text, coalesce(ls.metric, us.metric),
	format('ledger units %s cost %s count %s, rollup units %s cost %s count %s', ls.u, ls.c, ls.n, us.u, us.c, us.n)
FROM ls FULL JOIN us ON ls.customer_id = us.customer_id AND ls.metric = us.metric
WHERE ls.u IS DISTINCT FROM us.u OR ls.c IS DISTINCT FROM us.c OR ls.n IS DISTINCT FROM us.n`

// rollupDiffs lists the (customer, metric) pairs where usage_hourly and
// the ledger disagree, and how many pairs the rollup reservations; nil without
// the table (a schema before 020).
func rollupDiffs(ctx context.Context, dbURL, tenant string) ([]string, int, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass('usage_hourly') IS NOT NULL").Scan(&exists); err != nil || !exists {
		return nil, 0, err
	}
	var pairs int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM (SELECT DISTINCT customer_id, billable_metric_key FROM usage_hourly WHERE tenant_id = $1) p", tenant).Scan(&pairs); err != nil {
		return nil, 0, err
	}
	rows, err := conn.Query(ctx, rollupSQL, tenant)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	diffs := []string{}
	for rows.Next() {
		var c, m, d string
		if err := rows.Scan(&c, &m, &d); err != nil {
			return nil, 0, err
		}
		diffs = append(diffs, fmt.Sprintf("customer %s metric %s: %s", c, m, d))
	}
	return diffs, pairs, rows.Err()
}

func firstSchema(steps []Replacement) int {
	if len(steps) == 0 {
		return -1
	}
	return steps[0].Schema
}

// writeUpgradeReport writes upgrade-<stamp>.md and .json under dir.
func writeUpgradeReport(dir string, u *UpgradeResult) (md, js string, err error) {
	return writeResult(dir, "upgrade-"+u.Stamp, u, upgradeMarkdown(u))
}

// upgradeMarkdown is the upgrade run's report.
func upgradeMarkdown(u *UpgradeResult) string {
	r := &u.RunResult
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# make upgrade-test: %s (%s)\n\n", r.Verdict(), r.Started.Format("2006-01-02 15:04:05 UTC"))
	w("Issue 25. %s. Run length %.0f s. Reproduce: `make upgrade-test` (or `go run ./bench/chaos -upgrade -from %s`).\n\n",
		r.Setting, r.Finished.Sub(r.Started).Seconds(), u.From.Commit)
	w("| | release | commit | `creditd version` |\n|---|---|---|---|\n")
	w("| from | %s | %s | %s |\n| to | %s | %s%s | %s |\n\n", u.From.Name, u.From.Commit, esc(u.From.Version), u.To.Name, u.To.Commit,
		map[bool]string{true: " (+ uncommitted changes)"}[u.To.Dirty], esc(u.To.Version))
	if r.Error != "" {
		w("**Run error:** %s\n\n", r.Error)
	}
	writeChecks(&b, r.Checks)
	w("\n## Replacements\n\nSchema version %d on the old fleet.\n\n", u.SchemaBefore)
	w("| node | SIGTERM at | exited after | new node ready after | schema | nodes' commits after | money attempts in its window | checks in its window |\n|---|---|---|---|---|---|---|---|\n")
	for _, s := range u.Steps {
		w("| %d | %s | %.1f s | %.1f s | %d | %s | %s | %s |\n", s.Node, s.Stopping.Format("15:04:05"), s.StopS, s.ReadyS, s.Schema,
			strings.Join(s.Commits, " "), esc(s.Money.String()), esc(s.Checks.String()))
	}
	for _, s := range u.Steps {
		if len(s.Readiness) > 0 {
			w("\n/readyz during node %d's turn (every %s, the node itself left out):\n\n", s.Node, readyPollEvery)
			for _, p := range s.Readiness {
				w("- %s\n", p)
			}
		}
	}
	w("\n## Answers over the whole run\n\n| | figures |\n|---|---|\n| money attempts | %s |\n| checks | %s |\n| 503s without Retry-After | %d |\n| 5xx other than 503 (creditd's or HAProxy's) | %d |\n",
		esc(u.Money.String()), esc(u.Checks.String()), u.No503RetryAfter, u.Other5xx)
	writeCounts(&b, r.Counts)
	var kinds []string
	for _, k := range sortedKeys(u.AckByKind) {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, u.AckByKind[k]))
	}
	w("| acknowledged by kind | %s |\n", strings.Join(kinds, ", "))
	w("\n## Timeline\n\n| UTC | +s | event |\n|---|---|---|\n")
	for _, e := range r.Timeline {
		w("| %s | %.1f | %s |\n", e.Time.Format("15:04:05.0"), e.At, esc(e.What))
	}
	if len(r.Problems) > 0 {
		w("\n## Problems (first 50)\n\n")
		for i, p := range r.Problems {
			if i == 50 {
				break
			}
			w("- %s\n", p)
		}
	}
	if r.Kept != "" {
		w("\nKept for inspection: %s.\n", r.Kept)
	}
	return b.String()
}

// sortedKeys is m's keys in order.
func sortedKeys(m map[string]int64) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
