package lua

import (
	"strings"
	"sync"
)

// scriptNames maps every way a command names one of creditd's scripts (the
// library function of an FCALL, the SHA1 of an EVALSHA) to the script's
// file name, for metrics and traces that label a Redis call by script.
var (
	scriptNamesOnce sync.Once
	scriptNames     map[string]string
)

func namesOfScripts() map[string]string {
	scriptNamesOnce.Do(func() {
		library()
		m := map[string]string{}
		for _, sc := range libraryScripts {
			m[sc.fnName] = sc.name
			m[sc.eval.Hash()] = sc.name
		}
		for name, sc := range map[string]interface{ Hash() string }{
			"delivery_slots": deliverySlotsScript, "gcra": gcraScript, "idem_finish": idemFinishScript,
			"idem_abort": idemAbortScript, "gauge_value": gaugeValueScript,
		} {
			m[sc.Hash()] = name
		}
		scriptNames = m
	})
	return scriptNames
}

// ScriptName is the file name of the creditd script a Redis command runs
// (args as redis.Cmder.Args gives them: an FCALL of the library, or an
// EVALSHA or EVAL of a script); ok is false for any other command. It does
// not allocate.
func ScriptName(args []any) (name string, ok bool) {
	if len(args) < 2 {
		return "", false
	}
	cmd, _ := args[0].(string)
	ref, _ := args[1].(string)
	switch {
	case strings.EqualFold(cmd, "fcall"), strings.EqualFold(cmd, "fcall_ro"), strings.EqualFold(cmd, "evalsha"), strings.EqualFold(cmd, "evalsha_ro"):
		name, ok = namesOfScripts()[ref]
		return name, ok
	case strings.EqualFold(cmd, "eval"), strings.EqualFold(cmd, "eval_ro"):
		// EVAL sends the text; go-redis' Script.Run falls back to it only
		// after a NOSCRIPT, so naming it is worth no hashing here.
		return "eval", true
	}
	return "", false
}

// LibraryScriptNames lists the file names of the library's scripts (the
// money and state scripts), for metrics that show each from the start.
func LibraryScriptNames() []string {
	out := make([]string, 0, len(libraryScripts))
	for _, sc := range libraryScripts {
		out = append(out, sc.name)
	}
	return out
}
