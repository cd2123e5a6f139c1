package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// writeReport writes chaos-<stamp>.md and .json under dir.
func writeReport(dir string, r *RunResult) (md, js string, err error) {
	return writeResult(dir, "chaos-"+r.Stamp, r, markdown(r))
}

// writeResult writes v as <name>.json and text as <name>.md under dir, the
// pair every chaos and upgrade run leaves in bench/results.
func writeResult(dir, name string, v any, text string) (md, js string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	md, js = filepath.Join(dir, name+".md"), filepath.Join(dir, name+".json")
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return "", "", err
	}
	if err := os.WriteFile(js, append(b, '\n'), 0o644); err != nil {
		return "", "", err
	}
	return md, js, os.WriteFile(md, []byte(text), 0o644)
}

// markdown is the run's report.
func markdown(r *RunResult) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# make chaos: %s (%s)\n\n", r.Verdict(), r.Started.Format("2006-01-02 15:04:05 UTC"))
	w("Issue 11 item 6 and issue 25. %s. Run length %.0f s. Reproduce: `make chaos` (or `go run ./bench/chaos -runs 1`).\n\n", r.Setting, r.Finished.Sub(r.Started).Seconds())
	if r.Error != "" {
		w("**Run error:** %s\n\n", r.Error)
	}
	writeChecks(&b, r.Checks)
	writeCounts(&b, r.Counts)
	if fl := r.Flood; fl != nil {
		w("\n## Rate limit flood\n\nOne API key limited to %d/s (burst %d), GET /v1/customers through HAProxy from 8 clients at 4x the rate together for %.1f s while a creditd node was killed and started again: %d 2xx (want %.0f +-10 %%), %d 429, %d other, %d requests.\n",
			fl.PerSecond, fl.Burst, fl.Seconds, fl.OK, fl.Want, fl.Limited, fl.Other, fl.Offered)
	}
	w("\n## Failovers\n\n| master killed | pid | replica promoted | promoted after | restarted | back as in-sync replica after |\n|---|---|---|---|---|---|\n")
	for _, fo := range r.Failovers {
		w("| %s | %d | %s | %s | %s | %s |\n", fo.Master, fo.MasterPid, fo.Replica, since(fo.PromotedOK, fo.Promoted.Sub(fo.Killed).Seconds()),
			fo.Restarted.Format("15:04:05"), since(fo.RejoinedOK, fo.Rejoined.Sub(fo.Killed).Seconds()))
	}
	for i, fo := range r.Failovers {
		if len(fo.Avail) == 0 && len(fo.Readiness) == 0 {
			continue
		}
		w("\n### Failover %d: %s killed, %s promoted after %s\n\n", i+1, fo.Master, fo.Replica, since(fo.PromotedOK, fo.Promoted.Sub(fo.Killed).Seconds()))
		if len(fo.Avail) > 0 {
			w("Availability per shard from the kill to the promotion (customers' shard from their partition's hash tag; the money column \"clear\" counts the first attempts whose idempotency record is not on the killed shard either):\n\n")
			w("| shard | customers | checks 2xx | checks longest 503 run | checks 2xx p50 / p99 / max | money 2xx | money longest 503 run | money clear of the killed shard |\n|---|---|---|---|---|---|---|---|\n")
			for _, sa := range fo.Avail {
				name := sa.Shard
				if sa.Dead {
					name = "**killed** " + name
				}
				clear := "n/a"
				if sa.Clear != nil {
					clear = fmt.Sprintf("%d/%d (%.1f %%)", sa.Clear.OK, sa.Clear.N, sa.Clear.Share())
				}
				w("| %s | %d | %d/%d (%.1f %%) | %s | %.0f / %.0f / %.0f ms | %d/%d (%.1f %%) | %s | %s |\n", name, sa.Customers, sa.Checks.OK, sa.Checks.N, sa.Checks.Share(),
					run503(sa.Checks), sa.Checks.OKP50Ms, sa.Checks.OKP99Ms, sa.Checks.OKMaxMs, sa.Money.OK, sa.Money.N, sa.Money.Share(), run503(sa.Money), clear)
			}
			w("\n")
		}
		if len(fo.Readiness) > 0 {
			w("/readyz polled every %s from the kill until the old master rejoined (a node killed this cycle left out):\n\n", readyPollEvery)
			for _, p := range fo.Readiness {
				w("- %s\n", p)
			}
		}
	}
	if wr := r.WriteRefusal; wr != nil {
		w("\n## Redis write refusal\n\n%s refused writes for %.1f s (maxmemory %d under %d bytes counted, noeviction; before: %s); %d of the load's customers live there.\n\n",
			wr.Shard, wr.Seconds, wr.Maxmemory, wr.UsedBytes, wr.Previous, len(wr.Customers))
		w("| answers while it refused | figures |\n|---|---|\n| money attempts that needed it (customer or idempotency record) | %s |\n| money attempts elsewhere | %s |\n| checks of its customers | %s |\n",
			esc(wr.Touching.String()), esc(wr.Others.String()), esc(wr.Checks.String()))
		for _, p := range wr.Readiness {
			w("\n- /readyz %s", p)
		}
		w("\n")
	}
	if po := r.PostgresOutage; po != nil {
		w("\n## Postgres outage\n\nThe run's private Postgres stopped (SIGQUIT, as `pg_ctl stop -m immediate`) at %s and started again %.1f s later.\n\n",
			po.Stopped.Format("15:04:05"), po.Seconds)
		w("| answers while it was down | figures |\n|---|---|\n| checks | %s |\n| money attempts | %s |\n", esc(po.Checks.String()), esc(po.Money.String()))
		w("| first 2xx after it was back | money %.1f s, check %.1f s |\n", po.FirstMoneyOKS, po.FirstCheckOKS)
		for _, p := range po.Readiness {
			w("\n- /readyz %s", p)
		}
		w("\n")
	}
	w("\n## creditd node kills\n\n| node | pid | killed | ready again after |\n|---|---|---|---|\n")
	for _, nk := range r.NodeKills {
		w("| %d | %d | %s | %s |\n", nk.Node, nk.Pid, nk.Killed.Format("15:04:05"), since(nk.Ready, nk.Restarted.Sub(nk.Killed).Seconds()))
	}
	w("\n## Timeline\n\n| UTC | +s | event |\n|---|---|---|\n")
	for _, e := range r.Timeline {
		w("| %s | %.1f | %s |\n", e.Time.Format("15:04:05.0"), e.At, strings.ReplaceAll(e.What, "|", "\\|"))
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

// run503 is an Avail's longest run of 503s.
func run503(a Avail) string {
	if a.Longest503 == 0 {
		return "none"
	}
	return fmt.Sprintf("%d (%.1f s)", a.Longest503, a.Longest503S)
}

func esc(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

func since(ok bool, s float64) string {
	if !ok {
		return "not within the limit"
	}
	return fmt.Sprintf("%.1f s", s)
}

// writeChecks is a report's table of checks.
func writeChecks(b *strings.Builder, checks []Check) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## Checks\n\n| check | result | detail |\n|---|---|---|\n")
	for _, c := range checks {
		res := "PASS"
		if !c.Pass {
			res = "FAIL"
		}
		if !c.Gating {
			res += " (reported, not gating)"
		}
		w("| %s | %s | %s |\n", c.Name, res, strings.ReplaceAll(c.Detail, "|", "\\|"))
	}
}

// writeCounts is a report's table of the money load's figures.
func writeCounts(b *strings.Builder, c Counts) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("\n## Counts\n\n| figure | value |\n|---|---|\n")
	w("| money operations (distinct Idempotency-Keys) | %d |\n| acknowledged (2xx) | %d |\n| of which answered with X-Idempotent-Replayed | %d |\n", c.Sent, c.Acknowledged, c.Replayed)
	w("| refused (4xx) | %d |\n| unresolved | %d |\n| HTTP requests (attempts) | %d |\n| operations retried | %d |\n| retries | %d |\n", c.Refused, c.Unresolved, c.Requests, c.Retried, c.Retries)
	w("| 503 answers | %d |\n| creditd 5xx other than 503 | %d |\n| HAProxy 5xx other than 503 (in flight on a killed node) | %d |\n| 409 still in progress | %d |\n| transport errors | %d |\n",
		c.Got503, c.Other5xx, c.Balancer5xx, c.InProgress, c.Transport)
	var codes []string
	for s, n := range c.ByStatus {
		codes = append(codes, fmt.Sprintf("%s: %d", s, n))
	}
	sort.Strings(codes)
	w("| answers by status | %s |\n", strings.Join(codes, ", "))
	if len(c.Answers) > 0 {
		w("\nAnswers other than 2xx to the money load (digits blanked to N):\n\n| count | answer |\n|---|---|\n")
		var kinds []string
		for k := range c.Answers {
			kinds = append(kinds, k)
		}
		sort.Slice(kinds, func(i, j int) bool { return c.Answers[kinds[i]] > c.Answers[kinds[j]] })
		for _, k := range kinds {
			w("| %d | %s |\n", c.Answers[k], strings.ReplaceAll(k, "|", "\\|"))
		}
	}
}
