// Script arguments, one ordered description per script: a struct whose
// fields are the script's ARGV in order, each tagged with the name of the
// Lua local that reads it. TestArgvMatchesScripts holds each struct against
// its .lua file (the same names at the same positions) and checks that its
// list writes every field in field order, so an argument added in one place
// and not the other fails. list is plain code: nothing reflects per call.
//
// Tags: `lua:"name"`; ",opt" for trailing arguments sent only when set
// (the script reads them with `or ''`). A slice field is the repeated item
// group of a multi-metric script (`ARGV[at + k]`); a field tagged ",tail"
// comes after the items (`ARGV[k + m * n]`).

package lua

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// headArgv are ARGV[1..8] of every money script.
type headArgv struct {
	Now         string `lua:"now"`
	OpID        string `lua:"op_id"`
	Tenant      string `lua:"tenant"`
	Env         string `lua:"env"`
	Customer    string `lua:"customer"`
	Idem        string `lua:"idem"`
	RequestHash string `lua:"request_hash"`
	OpTTL       string `lua:"op_ttl_ms"`
}

// newHead is the head of an operation: the idempotency key goes as JSON
// text, the request hash as it is.
func newHead(now time.Time, op uuid.UUID, c engine.CustomerKey, idempotencyKey, requestHash string) (headArgv, error) {
	idem, err := jsonString(idempotencyKey)
	if err != nil {
		return headArgv{}, err
	}
	// The scripts splice the request hash into JSON unescaped (prelude q):
	// it is a hex fingerprint, so anything else is a caller bug.
	for i := 0; i < len(requestHash); i++ {
		if c := requestHash[i]; c < 0x20 || c == '"' || c == '\\' {
			return headArgv{}, fmt.Errorf("lua: request hash %q is not plain text", requestHash)
		}
	}
	// The three ids as one string, sliced: one allocation, not three.
	var ids [3 * 36]byte
	hexUUID(ids[0:36], op)
	hexUUID(ids[36:72], c.TenantID)
	hexUUID(ids[72:], c.CustomerID)
	all := string(ids[:])
	return headArgv{Now: strconv.FormatInt(now.UnixMilli(), 10), OpID: all[0:36], Tenant: all[36:72],
		Env: string(c.Environment), Customer: all[72:], Idem: idem, RequestHash: requestHash,
		OpTTL: opTTLText}, nil
}

// jsonString is s as JSON text, as json.Marshal writes it. A key of plain
// printable ASCII that json.Marshal would not escape is quoted without it
// (one allocation: every money call sends its idempotency key this way).
func jsonString(s string) (string, error) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, err := json.Marshal(s)
			return string(b), err
		}
	}
	return "\"" + s + "\"", nil
}

// opTTLText is OpRetention in ms, as every head sends it.
var opTTLText = strconv.FormatInt(OpRetention.Milliseconds(), 10)

// put appends h to out, as pointers to h's fields: go-redis writes a
// *string as the string, and a pointer goes into an interface without the
// string header a string needs, an allocation each (issue 26). h must not
// change while the command is sent (a list is built for one call).
func (h *headArgv) put(out []any) []any {
	return append(out, &h.Now, &h.OpID, &h.Tenant, &h.Env, &h.Customer, &h.Idem, &h.RequestHash, &h.OpTTL)
}

// hotHead are ARGV[1..9] of the hot-path scripts: the head and the request
// context as JSON.
type hotHead struct {
	headArgv
	Ctx string `lua:"ctx"`
}

// newHotHead is the hot head of the command h with context mc.
func newHotHead(h engine.CommandHeader, mc engine.MutationContext) (hotHead, error) {
	head, err := newHead(h.Now, h.OpID, h.Customer, h.IdempotencyKey, h.RequestHash)
	if err != nil {
		return hotHead{}, err
	}
	// The budgets' periods are those holding the command's instant, the
	// now the script runs at (prelude/budgets.lua budgets_of).
	if len(mc.Budgets) > 0 {
		mc.BudgetArg = engine.BudgetArg(mc.Budgets, h.Now)
	}
	// By hand: json.Marshal's reflection was a few % of creditd's CPU per
	// consume (issue 26); the bytes are the same (engine's test holds it).
	var buf [160]byte
	return hotHead{headArgv: head, Ctx: string(engine.AppendMutationContextJSON(buf[:0], &mc))}, nil
}

// newHotHeadMeta is newHotHead and meta as the JSON text a script splices.
func newHotHeadMeta(h engine.CommandHeader, mc engine.MutationContext, meta engine.Metadata) (hotHead, string, error) {
	head, err := newHotHead(h, mc)
	if err != nil {
		return hotHead{}, "", err
	}
	text, err := jsonText(meta)
	return head, text, err
}

// start is a new argument list of room n beginning with h (pointers to
// its fields, as put).
func (h *hotHead) start(n int) []any {
	return append(h.headArgv.put(make([]any, 0, n)), &h.Ctx)
}

// consumeArgv are consume.lua's arguments.
type consumeArgv struct {
	hotHead
	Metric string `lua:"metric"`
	Units  string `lua:"units"`
	Terms  string `lua:"terms"`
	Policy string `lua:"policy"`
	Meta   string `lua:"entry_meta"`
	// The pool of a child customer (engine.PoolDraw), sent only for one.
	Pool    string `lua:"pool_arg,opt"`
	PoolOp  string `lua:"pool_op,opt"`
	PoolCtx string `lua:"pool_ctx,opt"`
}

func (a *consumeArgv) list() []any {
	// Pointers to the fields, as put: a consume is the hot path.
	out := append(a.start(17), &a.Metric, &a.Units, &a.Terms, &a.Policy, &a.Meta)
	if a.Pool != "" {
		out = append(out, a.Pool, a.PoolOp, a.PoolCtx)
	}
	return out
}

// itemArgv is one item of consume_multi.lua and reserve_multi.lua.
type itemArgv struct {
	Metric string `lua:"metric"`
	Units  string `lua:"units"`
	Terms  string `lua:"terms"`
}

// consumeMultiArgv are consume_multi.lua's arguments.
type consumeMultiArgv struct {
	hotHead
	Policy string `lua:"policy"`
	Meta   string `lua:"entry_meta"`
	N      string `lua:"n"`
	Items  []itemArgv
	// The pool of a child customer, as consumeArgv's, sent only for one.
	Pool poolArgv `lua:",tail"`
}

// poolArgv is the pool of a child customer after a multi-metric
// consume's items (engine.PoolDraw).
type poolArgv struct {
	Pool    string `lua:"pool_arg"`
	PoolOp  string `lua:"pool_op"`
	PoolCtx string `lua:"pool_ctx"`
}

func (a *consumeMultiArgv) list() []any {
	out := append(a.start(15+3*len(a.Items)), a.Policy, a.Meta, a.N)
	for _, it := range a.Items {
		out = append(out, it.Metric, it.Units, it.Terms)
	}
	if a.Pool.Pool != "" {
		out = append(out, a.Pool.Pool, a.Pool.PoolOp, a.Pool.PoolCtx)
	}
	return out
}

// reserveArgv are reserve.lua's arguments.
type reserveArgv struct {
	hotHead
	ResID    string `lua:"res_id"`
	Metric   string `lua:"metric"`
	EstUnits string `lua:"est_units"`
	Terms    string `lua:"terms"`
	Expires  string `lua:"expires"`
	Meta     string `lua:"meta"`
}

func (a *reserveArgv) list() []any {
	return append(a.start(15), a.ResID, a.Metric, a.EstUnits, a.Terms, a.Expires, a.Meta)
}

// reserveMultiArgv are reserve_multi.lua's arguments.
type reserveMultiArgv struct {
	hotHead
	ResID   string `lua:"res_id"`
	Expires string `lua:"expires"`
	Meta    string `lua:"meta"`
	N       string `lua:"n"`
	Items   []itemArgv
}

func (a *reserveMultiArgv) list() []any {
	out := append(a.start(13+3*len(a.Items)), a.ResID, a.Expires, a.Meta, a.N)
	for _, it := range a.Items {
		out = append(out, it.Metric, it.Units, it.Terms)
	}
	return out
}

// mergeArgv are the two arguments a commit gets when Go merged its
// metadata (runCommit): the reservation's field "r:<id>" read with the stored
// metadata it merged into, and the result.
type mergeArgv struct {
	Stored string `lua:"stored_res"`
	Merged string `lua:"merged_meta"`
}

// commitArgv are commit.lua's arguments.
type commitArgv struct {
	hotHead
	ResID  string `lua:"res_id"`
	Actual string `lua:"actual"`
	Terms  string `lua:"terms_arg"`
	Meta   string `lua:"meta"`
	// Partial is "1" for a partial commit (the reservation stays active).
	Partial string `lua:"partial"`
	Merge   mergeArgv
}

func (a *commitArgv) list() []any {
	return a.Merge.put(append(a.start(16), a.ResID, a.Actual, a.Terms, a.Meta, a.Partial))
}

// extendArgv are extend.lua's arguments.
type extendArgv struct {
	hotHead
	ResID   string `lua:"res_id"`
	Units   string `lua:"add_units"`
	Terms   string `lua:"terms_arg"`
	Expires string `lua:"expires"`
}

func (a *extendArgv) list() []any {
	return append(a.start(13), a.ResID, a.Units, a.Terms, a.Expires)
}

// put appends m to out when Go merged (Merged set).
func (m *mergeArgv) put(out []any) []any {
	if m.Merged == "" {
		return out
	}
	return append(out, m.Stored, m.Merged)
}

// commitItemArgv is one item of commit_multi.lua.
type commitItemArgv struct {
	Metric   string `lua:"metric"`
	EstUnits string `lua:"est_units"`
	EstCost  string `lua:"est_cost"`
	Units    string `lua:"units"`
	Terms    string `lua:"terms_arg"`
}

// commitMultiArgv are commit_multi.lua's arguments.
type commitMultiArgv struct {
	hotHead
	ResID string `lua:"res_id"`
	Meta  string `lua:"meta"`
	N     string `lua:"n"`
	Items []commitItemArgv
	Merge mergeArgv `lua:",tail"`
}

func (a *commitMultiArgv) list() []any {
	out := append(a.start(14+5*len(a.Items)), a.ResID, a.Meta, a.N)
	for _, it := range a.Items {
		out = append(out, it.Metric, it.EstUnits, it.EstCost, it.Units, it.Terms)
	}
	return a.Merge.put(out)
}

// releaseArgv are release.lua's arguments.
type releaseArgv struct {
	hotHead
	ResID  string `lua:"res_id"`
	Expire string `lua:"expire"`
}

func (a *releaseArgv) list() []any { return append(a.start(11), a.ResID, a.Expire) }

// gaugeArgv are gauge.lua's arguments.
type gaugeArgv struct {
	hotHead
	Metric       string `lua:"metric"`
	Delta        string `lua:"delta"`
	Cap          string `lua:"cap"`
	Allow        string `lua:"allow"`
	LeaseID      string `lua:"lease_id,opt"`
	LeaseSeconds string `lua:"lease_s,opt"`
}

func (a *gaugeArgv) list() []any {
	out := append(a.start(15), a.Metric, a.Delta, a.Cap, a.Allow)
	if a.LeaseID != "" {
		out = append(out, a.LeaseID, a.LeaseSeconds)
	}
	return out
}

// leaseArgv are lease.lua's arguments.
type leaseArgv struct {
	hotHead
	Metric  string `lua:"metric"`
	LeaseID string `lua:"lease_id"`
	Action  string `lua:"action"`
	Seconds string `lua:"renew_s"`
}

func (a *leaseArgv) list() []any {
	return append(a.start(13), a.Metric, a.LeaseID, a.Action, a.Seconds)
}

// stackArgv are the two arguments a stacked grant gets when Go matched
// the metadata (bounded.go): the start it found ("none") and the account
// version it read.
type stackArgv struct {
	Start   string `lua:"stack_start"`
	Version string `lua:"stack_version"`
}

// grantArgv are grant.lua's arguments.
type grantArgv struct {
	headArgv
	AccountID     string `lua:"account_id"`
	EntryType     string `lua:"entry_type"`
	Reason        string `lua:"reason"`
	EntryMeta     string `lua:"entry_meta"`
	BlockID       string `lua:"block_id"`
	Amount        string `lua:"amount"`
	Priority      string `lua:"priority"`
	Source        string `lua:"source"`
	BlockMeta     string `lua:"new_meta"`
	Expires       string `lua:"expires_arg"`
	StackMS       string `lua:"stack_ms"`
	StackFallback string `lua:"stack_fallback"`
	StackMatch    string `lua:"stack_match"`
	Ctx           string `lua:"ctx"`
	Cap           string `lua:"cap_arg"`
	Stack         stackArgv
	// Scope is the block's metric keys joined by "," ("" for every metric).
	Scope string `lua:"scope_arg"`
}

func (a *grantArgv) list() []any {
	out := append(a.put(make([]any, 0, 25)), a.AccountID, a.EntryType, a.Reason, a.EntryMeta, a.BlockID,
		a.Amount, a.Priority, a.Source, a.BlockMeta, a.Expires, a.StackMS, a.StackFallback, a.StackMatch,
		a.Ctx, a.Cap)
	if a.Stack.Version != "" || a.Scope != "" {
		out = append(out, a.Stack.Start, a.Stack.Version)
	}
	if a.Scope != "" {
		out = append(out, a.Scope)
	}
	return out
}

// debitArgv are debit.lua's arguments.
type debitArgv struct {
	headArgv
	Amount    string `lua:"amount"`
	EntryType string `lua:"entry_type"`
	Source    string `lua:"entry_source"`
	Reason    string `lua:"reason"`
	EntryMeta string `lua:"entry_meta"`
	Ctx       string `lua:"ctx"`
}

func (a *debitArgv) list() []any {
	return append(a.put(make([]any, 0, 14)), a.Amount, a.EntryType, a.Source, a.Reason, a.EntryMeta, a.Ctx)
}

// rolloverArgv are rollover.lua's arguments.
type rolloverArgv struct {
	headArgv
	Blocks    string `lua:"ids"`
	Percent   string `lua:"pct"`
	BlockID   string `lua:"block_id"`
	Priority  string `lua:"priority"`
	Source    string `lua:"source"`
	BlockMeta string `lua:"new_meta"`
	Expires   string `lua:"expires"`
	EntryType string `lua:"entry_type"`
	EntryMeta string `lua:"entry_meta"`
	Ctx       string `lua:"ctx"`
}

func (a *rolloverArgv) list() []any {
	return append(a.put(make([]any, 0, 18)), a.Blocks, a.Percent, a.BlockID, a.Priority, a.Source, a.BlockMeta,
		a.Expires, a.EntryType, a.EntryMeta, a.Ctx)
}

// expireArgv are expire.lua's arguments: the first five of a head.
type expireArgv struct {
	Now      string `lua:"now"`
	OpID     string `lua:"op_id"`
	Tenant   string `lua:"tenant"`
	Env      string `lua:"env"`
	Customer string `lua:"customer"`
}

func (a *expireArgv) list() []any { return []any{a.Now, a.OpID, a.Tenant, a.Env, a.Customer} }

// flagText is a boolean argument: "1" or "0".
func flagText(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
