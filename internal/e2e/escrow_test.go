package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creditd/creditd/client/edge"
)

// escrowLine is a line the escrow worker prints (testdata/escrowworker).
type escrowLine struct {
	edge.EscrowStats
	Final     bool  `json:"final"`
	Calls     int64 `json:"calls"`
	ConsumeNs int64 `json:"consume_ns"`
	Errors    int64 `json:"errors"`
}

// escrowWorker is one evaluator process and the lines it printed.
type escrowWorker struct {
	name  string
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []escrowLine
	exit  chan error
}

func (w *escrowWorker) last() escrowLine {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.lines) == 0 {
		return escrowLine{}
	}
	return w.lines[len(w.lines)-1]
}

// buildEscrowWorker builds testdata/escrowworker into a temporary
// directory.
func buildEscrowWorker(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	bin := filepath.Join(t.TempDir(), "escrowworker")
	cmd := exec.Command("go", "build", "-o", bin, "./testdata/escrowworker")
	cmd.Dir = filepath.Dir(file)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build escrow worker: %v\n%s", err, out)
	}
	return bin
}

// TestEscrowProcessesKilled (issue 27 item 2) states the escrow's books
// guarantee across processes: four evaluator processes consume for one
// block customer through local allowances against a running creditd, one
// is killed with -9 mid-run, the others run the credit out and close. Then
// the ledger equals the sum of what the reservations settled (and the
// balance the grant less it), the balance and effective balance were never
// seen below zero, no reservation is left, each surviving process's local usage
// was settled exactly, and the killed process lost no more than one settle
// interval's usage plus one settle in flight, which its own at-risk counter
// had counted.
func TestEscrowProcessesKilled(t *testing.T) {
	s := NewStack(t, SingleNode())
	tn := s.NewTenant(uniq("escrow"))
	raiseRateLimit(t, s.HTTP, s.URL, tn.ID)
	a := s.as(t, tn.Live)
	metric := a.perUnit(1) // one millicredit a unit: units and credit read alike
	cust := a.createCustomer(map[string]any{"external_id": uniq("cust"), "overage_policy": "block"})["id"].(string)
	const (
		grant      = 150_000
		unitsPerMs = 20 // per process: 20,000 units/s at most (a 1 ms ticker drops late ticks)
		settle     = 100 * time.Millisecond
		killAt     = 1200 * time.Millisecond // before the credit runs out, at full pace
		runMax     = 30 * time.Second        // the survivors run until refused, at most this long
	)
	a.grant(cust, map[string]any{"credits": grant})
	bin := buildEscrowWorker(t)

	workers := make([]*escrowWorker, 4)
	for i := range workers {
		w := &escrowWorker{name: fmt.Sprintf("w%d", i), exit: make(chan error, 1)}
		w.cmd = exec.Command(bin, "-url", s.URL, "-key", tn.Live, "-customer", cust, "-metric", metric,
			"-name", w.name, "-units-per-ms", fmt.Sprint(unitsPerMs), "-settle", settle.String(), "-ttl", "2s")
		w.cmd.Stderr = os.Stderr
		out, err := w.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := w.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.cmd.Process.Kill() })
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var l escrowLine
				if json.Unmarshal(sc.Bytes(), &l) == nil {
					w.mu.Lock()
					w.lines = append(w.lines, l)
					w.mu.Unlock()
				}
			}
			w.exit <- w.cmd.Wait()
		}()
		workers[i] = w
	}

	// The balance is watched from outside the whole time.
	var minBalance, minEffective int64 = grant, grant
	var samples int
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(20 * time.Millisecond):
			}
			r, err := TryCall(s.HTTP, s.URL, "GET", "/v1/customers/"+cust+"/credits", nil, "X-API-Key", tn.Live)
			if err != nil || r.Status != 200 {
				continue
			}
			b, _ := r.Body["balance"].(json.Number).Int64()
			e, _ := r.Body["effective_balance"].(json.Number).Int64()
			minBalance, minEffective = min(minBalance, b), min(minEffective, e)
			samples++
		}
	}()

	time.Sleep(killAt)
	killed := workers[0]
	if err := syscall.Kill(killed.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-killed.exit
	atKill := killed.last()
	// The survivors run the credit out (however slow a loaded machine makes
	// them): each has had a consume refused.
	for end := time.Now().Add(runMax); ; time.Sleep(20 * time.Millisecond) {
		all := true
		for _, w := range workers[1:] {
			all = all && w.last().RefusedUnits > 0
		}
		if all {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the survivors did not run the credit out in %v", runMax)
		}
	}
	time.Sleep(200 * time.Millisecond) // consumes refused for a while, top-ups asked again
	for _, w := range workers[1:] {
		_ = w.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, w := range workers[1:] {
		select {
		case err := <-w.exit:
			if err != nil {
				t.Errorf("%s exited with %v", w.name, err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s did not exit after SIGTERM", w.name)
		}
	}

	// The killed process's reservation returns by itself at expires_at (2 s after
	// its last extend) and the sweep.
	deadline := time.Now().Add(15 * time.Second)
	for {
		r := a.get("/v1/customers/" + cust + "/reservations?status=active&limit=100")
		if len(arr(t, r.Body["data"], "data")) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reservations still active 15 s after the run: %s", r.Raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(stopWatch)
	<-watched
	s.Drain()

	settledUnits, settledCost := map[string]int64{}, int64(0)
	reservations := 0
	for cursor := ""; ; {
		q := "?limit=100"
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		r := a.get("/v1/customers/" + cust + "/reservations" + q)
		data, more, next := page(t, r)
		for _, h := range data {
			hm := h.(map[string]any)
			proc, _ := hm["metadata"].(map[string]any)["process"].(string)
			settledUnits[proc] += Int(t, hm["settled_units"])
			settledCost += Int(t, hm["settled_cost"])
			reservations++
		}
		if !more {
			break
		}
		cursor = next.(string)
	}
	var ledger, held, viaReservations, other int64
	if err := s.Pool.QueryRow(context.Background(), `SELECT
			(SELECT COALESCE(SUM(delta), 0) FROM ledger_entries WHERE customer_id = $1),
			(SELECT COALESCE(SUM(estimated_cost - released), 0) FROM reservations WHERE customer_id = $1 AND status = 'active'),
			(SELECT COALESCE(SUM(delta), 0) FROM ledger_entries WHERE customer_id = $1 AND type = 'consumption' AND reference_id IS NOT NULL),
			(SELECT COALESCE(SUM(delta), 0) FROM ledger_entries WHERE customer_id = $1 AND type = 'consumption' AND reference_id IS NULL)`,
		cust).Scan(&ledger, &held, &viaReservations, &other); err != nil {
		t.Fatal(err)
	}
	c := a.credits(cust)
	balance := Int(t, c["balance"])

	var httpUnits, refused int64
	for _, w := range workers[1:] {
		fin := w.last()
		if !fin.Final {
			t.Fatalf("%s printed no final line: %+v", w.name, fin)
		}
		httpUnits += fin.HTTPUnits
		refused += fin.RefusedUnits
		if fin.Errors != 0 {
			t.Errorf("%s: %d consumes failed otherwise than by a refusal", w.name, fin.Errors)
		}
		if fin.AtRiskUnits != 0 || fin.UncollectedUnits != 0 || settledUnits[w.name] != fin.ConsumedLocalUnits || fin.SettledUnits != fin.ConsumedLocalUnits {
			t.Errorf("%s: consumed locally %d, settled per its stats %d, per creditd %d, at risk %d, uncollected %d: want all settled exactly",
				w.name, fin.ConsumedLocalUnits, fin.SettledUnits, settledUnits[w.name], fin.AtRiskUnits, fin.UncollectedUnits)
		}
		if fin.Calls > 0 {
			t.Logf("%s: %d units locally (%d refused, %d over HTTP), %d settles, %d top-ups (%d refused), max at risk %d; local Consume %d ns on average",
				w.name, fin.ConsumedLocalUnits, fin.RefusedUnits, fin.HTTPUnits, fin.Settles, fin.TopUps, fin.TopUpsRefused, fin.MaxAtRiskUnits, fin.ConsumeNs/fin.Calls)
		}
	}

	// Books (invariant 1): the ledger is the grant less what the reservations
	// settled and the HTTP consumes charged; nothing is held any more.
	if viaReservations != -settledCost || ledger != balance || balance != grant+viaReservations+other || held != 0 || Int(t, c["reserved_balance"]) != 0 {
		t.Errorf("books: ledger %d, balance %d, consumption by holds %d vs settled %d, by HTTP %d, still held %d/%v",
			ledger, balance, viaReservations, settledCost, other, held, c["reserved_balance"])
	}
	if other != 0 && -other < httpUnits {
		t.Errorf("HTTP consumes in the ledger %d, survivors alone reported %d", -other, httpUnits)
	}
	// No overspend (invariant 2): under block the credit ran out and was
	// refused, never passed.
	if minBalance < 0 || minEffective < 0 || balance < 0 || samples < 10 {
		t.Errorf("balance seen at %d, effective at %d (%d samples), final %d: want never below zero", minBalance, minEffective, samples, balance)
	}
	if refused == 0 {
		t.Errorf("the credit never ran out (nothing refused): the run does not test block")
	}

	// The killed process: what it had charged and creditd had not settled
	// is lost, at most one settle interval's usage plus a settle in flight,
	// and its at-risk counter had counted it.
	perInterval := int64(unitsPerMs) * settle.Milliseconds()
	reportLag := int64(unitsPerMs) * 10 * 2 // units after its last line (10 ms reports, doubled for scheduling)
	lost := atKill.ConsumedLocalUnits - settledUnits[killed.name]
	t.Logf("killed %s: %d units consumed by its last line, %d settled by creditd, %d lost (one settle interval: %d units); at risk on its last line %d, max %d; %d reservations in all",
		killed.name, atKill.ConsumedLocalUnits, settledUnits[killed.name], lost, perInterval, atKill.AtRiskUnits, atKill.MaxAtRiskUnits, reservations)
	if atKill.ConsumedLocalUnits == 0 || settledUnits[killed.name] == 0 {
		t.Fatalf("the killed process consumed %d and settled %d before the kill: nothing to check", atKill.ConsumedLocalUnits, settledUnits[killed.name])
	}
	if lost < -reportLag || lost > 2*perInterval {
		t.Errorf("the killed process lost %d units; want at most %d (one settle interval and one settle in flight)", lost, 2*perInterval)
	}
	if lost > atKill.AtRiskUnits+reportLag {
		t.Errorf("lost %d units but counted %d at risk on the last line (max %d)", lost, atKill.AtRiskUnits, atKill.MaxAtRiskUnits)
	}
}
