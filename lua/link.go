package lua

import (
	"regexp"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Every EVALSHA runs its script's top level again, so a script that carried
// the whole prelude paid for defining every helper (about 90,000 Redis
// instructions a call, measured under callgrind) before doing its own work.
// link gives each script only the prelude definitions it uses, transitively,
// in prelude order: the prelude stays the one definition of the money
// arithmetic, the block encoding and the outbox record, and each script
// stays lean.

// preludeChunk is one top-level definition of the prelude: its text (with
// the comment above it), the names it defines and the names it mentions.
type preludeChunk struct {
	text    string
	defines []string
	uses    map[string]bool
}

var (
	luaIdent   = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)
	luaDefFunc = regexp.MustCompile(`^local function ([A-Za-z_][A-Za-z0-9_]*)`)
	// A bare "local name" declares a function its do block defines (its
	// helpers local to the block).
	luaDefLocals = regexp.MustCompile(`^local ([A-Za-z_][A-Za-z0-9_, ]*?)\s*(?:=|$)`)
)

// splitPrelude cuts src at every line that opens a top-level local (column
// 0); the comment lines just above a definition belong to it, and lines that
// are neither (a function's body, a table's rows, a loop filling a table)
// belong to the definition above them.
func splitPrelude(src string) []preludeChunk {
	var chunks []preludeChunk
	var comment, cur []string
	flush := func() {
		if len(cur) == 0 {
			return
		}
		c := preludeChunk{text: strings.Join(cur, "\n"), uses: map[string]bool{}}
		first := cur[len(comment):][0]
		if m := luaDefFunc.FindStringSubmatch(first); m != nil {
			c.defines = []string{m[1]}
		} else if m := luaDefLocals.FindStringSubmatch(first); m != nil {
			for _, n := range strings.Split(m[1], ",") {
				c.defines = append(c.defines, strings.TrimSpace(n))
			}
		}
		for _, line := range cur {
			if strings.HasPrefix(strings.TrimSpace(line), "--") {
				continue
			}
			for _, id := range luaIdent.FindAllString(line, -1) {
				c.uses[id] = true
			}
		}
		chunks = append(chunks, c)
		cur, comment = nil, nil
	}
	var pending []string // comment lines waiting for the next definition
	for _, line := range strings.Split(src, "\n") {
		switch {
		case strings.HasPrefix(line, "local "):
			flush()
			comment = pending
			cur = append(append([]string{}, pending...), line)
			pending = nil
		case strings.HasPrefix(line, "--"):
			pending = append(pending, line)
		case strings.TrimSpace(line) == "":
			if len(pending) > 0 {
				pending = append(pending, line)
			}
		default:
			cur = append(cur, pending...)
			cur = append(cur, line)
			pending = nil
		}
	}
	flush()
	return chunks
}

// link is body preceded by the prelude definitions it needs.
func link(prelude, body string) string {
	chunks := splitPrelude(prelude)
	definedBy := map[string]int{}
	for i, c := range chunks {
		for _, n := range c.defines {
			definedBy[n] = i
		}
	}
	need := make([]bool, len(chunks))
	var visit func(uses map[string]bool)
	visit = func(uses map[string]bool) {
		for id := range uses {
			if i, ok := definedBy[id]; ok && !need[i] {
				need[i] = true
				visit(chunks[i].uses)
			}
		}
	}
	bodyUses := map[string]bool{}
	for _, id := range luaIdent.FindAllString(body, -1) {
		bodyUses[id] = true
	}
	visit(bodyUses)
	var sb strings.Builder
	for i, c := range chunks {
		if need[i] {
			sb.WriteString(c.text)
			sb.WriteString("\n")
		}
	}
	sb.WriteString(body)
	return sb.String()
}

// withPrelude wraps body, linked with the prelude, so Script.Run sends
// EVALSHA and falls back to EVAL after a server restart.
func withPrelude(body string) *redis.Script { return redis.NewScript(link(preludeLua, body)) }
