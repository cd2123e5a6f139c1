package lua

import (
	"embed"
	"strings"
)

// The prelude is the code the money and state scripts share: the money
// arithmetic, the block and reservation encodings, the account read and write,
// the Mutation JSON. It lives in lua/prelude/, one file per job, each
// opening with what it owns; preludeOrder joins them into one chunk (one
// text, as the library and link.go have always read it). It only defines
// locals (Redis forbids globals in scripts), so a file comes after every
// file whose locals it uses, and the chunk keeps under Lua's 200 locals.

//go:embed prelude/*.lua
var preludeFS embed.FS

// preludeOrder is the assembly order of lua/prelude/: each file after the
// files it uses. TestPreludeOrder fails when a file is missing from it or
// listed twice, or when a definition uses one that comes after it.
var preludeOrder = []string{
	"bounds.lua",           // per-customer caps (invariant 13)
	"money.lua",            // money arithmetic, integer formatting
	"text.lua",             // base 36, source letters, JSON strings
	"feed.lua",             // a tenant's change feed trimmed
	"pricing.lua",          // terms and prices
	"blocks.lua",           // a block's hash encoding and JSON
	"entries.lua",          // ledger entries and usage JSON
	"reservations.lua",     // a reservation's hash encoding and JSON
	"metadata.lua",         // metadata JSON merge and match
	"spend_order.lua",      // live, started, applies, spend order, balances
	"layout.lua",           // layout v2: spend-order index, kept reservations
	"account_read.lua",     // the account hash read into a
	"credit_line.lua",      // overage policy and the credit line
	"drain.lua",            // expiries and drains
	"scopes.lua",           // credits scoped to metrics
	"seen.lua",             // the seen filter
	"idempotency.lua",      // op records and replays
	"reservation_open.lua", // a reservation script's opening checks
	"account_commit.lua",   // the account hash written back
	"mutation.lua",         // the Mutation JSON and the outbox
	"gauges.lua",           // gauge counts and leases
	"budgets.lua",          // budget counters
	"pools.lua",            // shared pools
	"items.lua",            // a multi-metric call's items from ARGV
	"charge.lua",           // a consume's split and consumption entry
	"settle.lua",           // a commit's split, entry and settled figures
	"grants.lua",           // a grant's limits, stack_after start and cap
}

// preludeLua is the prelude's one chunk: preludeOrder's files joined by a
// blank line.
var preludeLua = assemblePrelude()

// Prelude is the prelude's one chunk, for measurements of what it costs
// Redis to define (bench's BenchmarkLuaPrelude).
func Prelude() string { return preludeLua }

func assemblePrelude() string {
	parts := make([]string, len(preludeOrder))
	for i, name := range preludeOrder {
		b, err := preludeFS.ReadFile("prelude/" + name)
		if err != nil {
			panic("lua: prelude file " + name + ": " + err.Error())
		}
		parts[i] = string(b)
	}
	return strings.Join(parts, "\n")
}
