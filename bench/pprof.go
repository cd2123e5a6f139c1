package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// CPUProfile is where creditd's CPU went during one scenario's 70 % run,
// from the Go CPU profile creditd served on CREDITD_PPROF_ADDR: shares of the
// sampled time by package (flat, so they add up to 100 %) and the functions
// that spent the most themselves. It names what is left of a goal.
type CPUProfile struct {
	Seconds  float64        `json:"sampled_seconds"`
	Packages []ProfileShare `json:"packages"`
	Top      []ProfileShare `json:"top_functions"`
	File     string         `json:"file,omitempty"`
	Error    string         `json:"error,omitempty"`
	raw      []byte
}

// ProfileShare is one package's or function's flat share of the samples.
type ProfileShare struct {
	Name  string  `json:"name"`
	Share float64 `json:"share"`
}

// fetchProfile asks creditd for a CPU profile of d; the caller runs the load
// meanwhile. It returns the profile's bytes.
func fetchProfile(ctx context.Context, addr string, d time.Duration) ([]byte, error) {
	secs := int(d / time.Second)
	if secs < 1 {
		secs = 1
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, secs), nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Timeout: d + 30*time.Second}).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("pprof: %s: %s", resp.Status, bytes.TrimSpace(body))
	}
	return body, nil
}

// summarizeProfile reads raw (a CPU profile of bin) through `go tool pprof
// -top` and sums the flat time by package.
func summarizeProfile(bin string, raw []byte, dir, name string) CPUProfile {
	p := CPUProfile{raw: raw}
	file := filepath.Join(dir, name+".pprof")
	if err := os.WriteFile(file, raw, 0o644); err != nil {
		p.Error = err.Error()
		return p
	}
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=100000", bin, file).Output()
	if err != nil {
		p.Error = fmt.Sprintf("go tool pprof: %v", err)
		return p
	}
	total, funcs := parsePprofTop(out)
	p.Seconds = total
	if total <= 0 {
		p.Error = "the profile holds no samples"
		return p
	}
	byPkg := map[string]float64{}
	for _, f := range funcs {
		byPkg[pprofPackage(f.Name)] += f.Share
	}
	for name, s := range byPkg {
		p.Packages = append(p.Packages, ProfileShare{Name: name, Share: s / total})
	}
	sort.Slice(p.Packages, func(i, j int) bool { return p.Packages[i].Share > p.Packages[j].Share })
	for i, f := range funcs {
		if i == 15 {
			break
		}
		p.Top = append(p.Top, ProfileShare{Name: f.Name, Share: f.Share / total})
	}
	return p
}

// parsePprofTop reads `go tool pprof -top` text: the total sampled seconds
// (from "Duration: ..., Total samples = X") and each function's flat
// seconds, largest first.
func parsePprofTop(out []byte) (float64, []ProfileShare) {
	var total float64
	var funcs []ProfileShare
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	inTable := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.Index(line, "Total samples = "); i >= 0 {
			total = pprofSeconds(strings.Fields(line[i+len("Total samples = "):])[0])
			continue
		}
		if strings.HasPrefix(line, "flat ") {
			inTable = true
			continue
		}
		if !inTable {
			continue
		}
		// flat flat% sum% cum cum% name...
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		funcs = append(funcs, ProfileShare{Name: strings.Join(f[5:], " "), Share: pprofSeconds(f[0])})
	}
	return total, funcs
}

// pprofSeconds reads a pprof duration such as "1.20s", "30ms" or "0".
func pprofSeconds(s string) float64 {
	unit := 1.0
	switch {
	case strings.HasSuffix(s, "ms"):
		s, unit = strings.TrimSuffix(s, "ms"), 1e-3
	case strings.HasSuffix(s, "us"), strings.HasSuffix(s, "µs"):
		s, unit = strings.TrimSuffix(strings.TrimSuffix(s, "us"), "µs"), 1e-6
	case strings.HasSuffix(s, "s"):
		s = strings.TrimSuffix(s, "s")
	}
	v, _ := strconv.ParseFloat(s, 64)
	return v * unit
}

// pprofPackage is the package path of a symbol ("github.com/x/y.(*T).M" ->
// "github.com/x/y"; "runtime.mallocgc" -> "runtime"), with creditd's own
// module shortened.
func pprofPackage(sym string) string {
	slash := strings.LastIndex(sym, "/")
	dot := strings.Index(sym[slash+1:], ".")
	pkg := sym
	if dot >= 0 {
		pkg = sym[:slash+1+dot]
	}
	return strings.TrimPrefix(pkg, "github.com/creditd/creditd/")
}

// profileSection writes, for every scenario with a CPU profile, creditd's
// CPU by package and its costliest functions: what a missed CPU goal is
// made of.
func profileSection(w func(string, ...any), r *Results, rel string) {
	var found bool
	for _, s := range r.Scenarios {
		if s.Profile != nil && s.Profile.Error == "" {
			found = true
		}
	}
	if !found {
		return
	}
	w("\n### Where creditd's CPU goes (Go CPU profile of the 70%% run)\n\n")
	w("Flat share of creditd's sampled CPU, by package (>= 2 %%) and by function (top 8). The profiles are beside this report (`go tool pprof <creditd binary> <file>`).\n\n")
	w("| scenario | sampled | by package | top functions |\n|---|---|---|---|\n")
	for _, s := range r.Scenarios {
		p := s.Profile
		if p == nil || p.Error != "" {
			continue
		}
		var pk, fn []string
		for _, x := range p.Packages {
			if x.Share >= 0.02 {
				pk = append(pk, fmt.Sprintf("%s %.0f%%", x.Name, 100*x.Share))
			}
		}
		for i, x := range p.Top {
			if i == 8 {
				break
			}
			fn = append(fn, fmt.Sprintf("`%s` %.1f%%", x.Name, 100*x.Share))
		}
		file := s.Name
		if p.File != "" {
			file = fmt.Sprintf("[%s](%s%s)", s.Name, rel, p.File)
		}
		w("| %s | %.1f s | %s | %s |\n", file, p.Seconds, strings.Join(pk, ", "), strings.Join(fn, "; "))
	}
}

// tablesSection writes which Postgres tables each scenario's op writes and
// reads by index (pg_stat_user_tables, per acknowledged op).
func tablesSection(w func(string, ...any), r *Results) {
	var rows []string
	for _, s := range r.Scenarios {
		if s.PG == nil || len(s.PG.Tables) == 0 {
			continue
		}
		var parts []string
		for _, t := range s.PG.Tables {
			var f []string
			for _, c := range []struct {
				n string
				v float64
			}{{"ins", t.Inserted}, {"upd", t.Updated}, {"del", t.Deleted}, {"idx", t.IdxScans}} {
				if c.v >= 0.01 {
					f = append(f, fmt.Sprintf("%s %.2f", c.n, c.v))
				}
			}
			parts = append(parts, fmt.Sprintf("%s (%s)", t.Name, strings.Join(f, ", ")))
		}
		rows = append(rows, fmt.Sprintf("| %s | %s |\n", s.Name, strings.Join(parts, "; ")))
	}
	if len(rows) == 0 {
		return
	}
	w("\n### What Postgres does per op (pg_stat_user_tables, 70%% run)\n\nRows inserted, updated and deleted and index scans per acknowledged op, by table (the persister's batches included). pg_stat_statements would name statements, but it needs `shared_preload_libraries`, which this machine's Postgres does not load.\n\n| scenario | tables |\n|---|---|\n")
	for _, row := range rows {
		w("%s", row)
	}
}
