package lua

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Every EVALSHA runs its script's top level again: even linked to the
// prelude definitions it uses (link.go), a consume paid about 25 µs of its
// ~85 µs of Redis time defining helpers before its own work, and each
// script kept its own copy of them in Redis' Lua heap. A Redis Functions
// library (Redis >= 7) defines the prelude once per node, at FUNCTION LOAD,
// and each money script is one function of it: an FCALL runs only the
// script's body (about 1 µs of fixed cost, measured on this box). Where
// the server has no functions (miniredis, Redis 6) the same body runs as a
// script of its own with EVALSHA, so both paths run one text.

// script is one money or state script: a function of the creditd library
// and, for servers without functions, the same body linked with the
// prelude as a script of its own.
type script struct {
	name   string        // the file's name ("consume")
	body   string        // the file's text
	eval   *redis.Script // prelude-linked body for EVALSHA
	fnName string        // its function in the library, set by library()
	// doorFnName is its function run under a fused door (door_fused.lua),
	// set by library().
	doorFnName string
}

// newScript is body (a file of lua/) as a script of the library; it joins
// the library, so it must be made at package initialization.
func newScript(name, body string) *script {
	sc := &script{name: name, body: body, eval: withPrelude(body)}
	libraryScripts = append(libraryScripts, sc)
	return sc
}

// Hash is the SHA1 of the script's EVALSHA text (SLOWLOG shows it).
func (sc *script) Hash() string { return sc.eval.Hash() }

// fn is the script's function in the library. Function names are global
// to a Redis server, so they carry the library's version: two creditd
// versions sharing a Redis during a rolling upgrade call their own code.
func (sc *script) fn() string {
	library()
	return sc.fnName
}

// doorFn is the script's function under a fused door (callFused).
func (sc *script) doorFn() string {
	library()
	return sc.doorFnName
}

var libraryScripts []*script

// libraryGCLua sets the Lua collector's pace on the library's first call
// (library_gc.lua says why).
//
//go:embed library_gc.lua
var libraryGCLua string

// libraryFrame names the shape library() gives each script (a body in
// BODY, its function and its fused-door function): part of the version,
// so two creditd builds that frame scripts differently never share names.
const libraryFrame = "body+door/2"

// lib is the library's source and the version its names carry.
type lib struct {
	version string
	text    string
}

var (
	libraryOnce sync.Once
	libraryText lib
)

// library builds the library once: the whole prelude (defined once per
// node, when loaded) and one function per script, whose KEYS and ARGV
// parameters stand for the globals an EVAL'd script sees, so its body is
// the file unchanged.
func library() lib {
	libraryOnce.Do(func() {
		h := sha1.New()
		h.Write([]byte(preludeLua))
		h.Write([]byte("\x00" + libraryFrame + "\x00" + libraryGCLua + "\x00" + doorFusedLua))
		for _, sc := range libraryScripts {
			h.Write([]byte("\x00" + sc.name + "\x00" + sc.body))
		}
		v := hex.EncodeToString(h.Sum(nil))[:12]
		var b strings.Builder
		b.WriteString("#!lua name=creditd_" + v + "\n")
		b.WriteString(preludeLua)
		b.WriteString("\n")
		b.WriteString(libraryGCLua)
		b.WriteString("\nlocal BODY = {}\n")
		b.WriteString(doorFusedLua)
		for _, sc := range libraryScripts {
			// Named once here, not per call: every money FCALL sends it.
			sc.fnName = "creditd_" + sc.name + "_" + v
			sc.doorFnName = "creditd_" + sc.name + "_door_" + v
			b.WriteString("\nBODY['" + sc.name + "'] = function(KEYS, ARGV)\n")
			b.WriteString(sc.body)
			// DOOR.record is cleared first: a body that raised an error under a
			// door (door_fused.lua) leaves it set for the next call.
			b.WriteString("\nend\nredis.register_function('" + sc.fnName + "', function(K, A) if not gc_paced then gc_pace() end if MONEY_GENERAL.on then MONEY_GENERAL.numbers() end DOOR.record = nil return BODY['" +
				sc.name + "'](K, A) end)\n")
			b.WriteString("redis.register_function('" + sc.doorFnName + "', function(K, A) if not gc_paced then gc_pace() end if MONEY_GENERAL.on then MONEY_GENERAL.numbers() end return door_run(K, A, BODY['" +
				sc.name + "']) end)\n")
		}
		libraryText = lib{version: v, text: b.String()}
	})
	return libraryText
}

// functionsState says whether a Store's server runs the library.
type functionsState struct {
	// no: the server has no FUNCTION/FCALL (miniredis, Redis < 7): every
	// script runs with EVALSHA from then on.
	no atomic.Bool
	mu sync.Mutex // one FUNCTION LOAD at a time per Store
}

// noFunctions reports whether this Store runs scripts with EVALSHA.
func (s *Store) noFunctions() bool { return s.funcs.no.Load() }

// isUnknownCommand tells a server without functions.
func isUnknownCommand(err error) bool {
	return err != nil && strings.Contains(strings.ToLower(err.Error()), "unknown command")
}

// isMissingCode tells an FCALL of a function the node lacks (a restarted
// node, a new version) or an EVALSHA of a script it lacks.
func isMissingCode(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "Function not found") || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// useEval switches the Store to EVALSHA for good.
func (s *Store) useEval() { s.funcs.no.Store(true) }

// call runs sc with keys and args: FCALL of its function (sharing a round
// trip with concurrent requests' commands, coalescer), loading the library
// onto the key's node when the node lacks it and calling again, or EVALSHA
// (EVAL when the server lacks the script) where the server has no
// functions.
func (s *Store) call(ctx context.Context, sc *script, keys []string, args ...any) *redis.Cmd {
	if s.noFunctions() {
		return sc.eval.Run(ctx, s.rdb, keys, args...)
	}
	cmd := s.fcall(ctx, sc, keys, args)
	switch err := cmd.Err(); {
	case isUnknownCommand(err):
		s.useEval()
		return sc.eval.Run(ctx, s.rdb, keys, args...)
	case isMissingCode(err):
		if lerr := s.loadLibraryFor(ctx, keys); lerr != nil {
			return cmd
		}
		return s.fcall(ctx, sc, keys, args)
	}
	return cmd
}

// fcall is one FCALL of sc's function through the coalescer. The command
// it returns is never one a pipeline may still be writing: a failure comes
// back on a command of its own.
func (s *Store) fcall(ctx context.Context, sc *script, keys []string, args []any) *redis.Cmd {
	return s.fcallNamed(ctx, sc.fn(), keys, args)
}

// fcallNamed is fcall of the library's function fn.
func (s *Store) fcallNamed(ctx context.Context, fn string, keys []string, args []any) *redis.Cmd {
	argv := fcallHead(fn, keys, len(args))
	return s.fcallArgv(ctx, append(argv, args...), len(keys))
}

// fcallHead is the start of an FCALL of fn on keys, with room for n
// arguments after them.
func fcallHead(fn string, keys []string, n int) []any {
	argv := make([]any, 3+len(keys), 3+len(keys)+n)
	argv[0], argv[1], argv[2] = "fcall", fn, len(keys)
	for i, k := range keys {
		argv[3+i] = k
	}
	return argv
}

// fcallArgv is fcallNamed of a whole FCALL command (fcallHead and the
// arguments), sent as it is: a caller that builds the arguments in place
// saves their copy.
func (s *Store) fcallArgv(ctx context.Context, argv []any, nKeys int) *redis.Cmd {
	cmd := redis.NewCmd(ctx, argv...)
	if nKeys > 0 {
		cmd.SetFirstKeyPos(3) // a Cluster routes by the first key
	}
	if err := s.trips.do(ctx, cmd); err != nil {
		failed := redis.NewCmd(ctx)
		failed.SetErr(err)
		return failed
	}
	return cmd
}

// queue adds sc to pipe (FCALL, or EVALSHA without functions); a reply
// that isMissingCode asks for prepare and another round.
func (s *Store) queue(ctx context.Context, pipe redis.Pipeliner, sc *script, keys []string, args ...any) *redis.Cmd {
	if s.noFunctions() {
		return sc.eval.EvalSha(ctx, pipe, keys, args...)
	}
	return pipe.FCall(ctx, sc.fn(), keys, args...)
}

// missing reports whether a queued call's error asks for prepare and a
// retry: the node lacked the library or the script, or the server has no
// functions at all (then the Store switches to EVALSHA).
func (s *Store) missing(err error) bool {
	if isUnknownCommand(err) {
		s.useEval()
		return true
	}
	return isMissingCode(err)
}

// prepare loads what queue needs onto every node the Store may send it to:
// the library on every master, or sc's script without functions.
func (s *Store) prepare(ctx context.Context, sc *script) error {
	if s.noFunctions() {
		return sc.eval.Load(ctx, s.rdb).Err()
	}
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return s.loadLibraryOn(ctx, c) })
	}
	err := s.loadLibraryOn(ctx, s.rdb)
	if isUnknownCommand(err) {
		s.useEval()
		return sc.eval.Load(ctx, s.rdb).Err()
	}
	return err
}

// prepareOn is prepare for one node (the replica-ack path talks to the
// slot master directly).
func (s *Store) prepareOn(ctx context.Context, c redis.Cmdable, sc *script) error {
	if s.noFunctions() {
		return sc.eval.Load(ctx, c).Err()
	}
	return s.loadLibraryOn(ctx, c)
}

// loadLibraryFor loads the library onto the node that serves keys.
func (s *Store) loadLibraryFor(ctx context.Context, keys []string) error {
	if cc, ok := s.rdb.(*redis.ClusterClient); ok && len(keys) > 0 {
		node, err := cc.MasterForKey(ctx, keys[0])
		if err != nil {
			return err
		}
		return s.loadLibraryOn(ctx, node)
	}
	return s.loadLibraryOn(ctx, s.rdb)
}

// loadLibraryOn runs FUNCTION LOAD of the library on c. Without REPLACE:
// when many calls find a restarted node empty at once, one compiles the
// library and the others' "already exists" is success, not another
// compile holding the node.
func (s *Store) loadLibraryOn(ctx context.Context, c redis.Cmdable) error {
	s.funcs.mu.Lock()
	defer s.funcs.mu.Unlock()
	err := c.FunctionLoad(ctx, library().text).Err()
	if err != nil && strings.Contains(err.Error(), "already exists") {
		return nil
	}
	if err != nil {
		return errors.Join(errors.New("lua: load the creditd library"), err)
	}
	// A fresh load is when a node may hold older builds' libraries
	// (library_prune.go).
	s.noteLibraryLoad(ctx, time.Now())
	s.pruneLibraries(ctx, c)
	return nil
}
