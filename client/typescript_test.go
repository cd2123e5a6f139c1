package client_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/creditd/creditd/internal/e2e"
	"github.com/creditd/creditd/internal/testenv"
)

// typescriptDir is the TypeScript client's package.
const typescriptDir = "../clients/typescript"

// TestTypeScriptClient starts creditd and runs the TypeScript client's
// `npm test` against it (CREDITD_URL, CREDITD_ADMIN_TOKEN): the generated
// types are checked against api/openapi.json, the client is compiled with
// tsc and node's test runner drives it. It needs node and the package's
// node_modules (scripts/test.sh runs `npm ci` when they are missing); it
// is skipped only where node is not installed, and in the Redis Cluster
// phase of make test, which would only run the same node tests again.
func TestTypeScriptClient(t *testing.T) {
	if len(testenv.ClusterSeeds()) > 0 {
		t.Skip("the TypeScript client's tests run in the single-Redis phase")
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed: the TypeScript client's tests are skipped")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatal("node is installed but npm is not: install npm to test the TypeScript client")
	}
	if _, err := os.Stat(filepath.Join(typescriptDir, "node_modules")); err != nil {
		t.Fatalf("clients/typescript/node_modules is missing: run `npm ci` there (scripts/test.sh does): %v", err)
	}
	s := e2e.NewStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "test")
	cmd.Dir = typescriptDir
	cmd.Env = append(os.Environ(), "CREDITD_URL="+s.URL, "CREDITD_ADMIN_TOKEN="+e2e.AdminToken, "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("npm test in clients/typescript: %v\n%s", err, out)
	}
	// node's test runner closes with its counts: every test ran, none was
	// skipped (the live ones skip without CREDITD_URL).
	count := func(name string) string {
		m := regexp.MustCompile(`(?m)^# ` + name + ` (\d+)$`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("no %q count in the node test output:\n%s", name, out)
		}
		return string(m[1])
	}
	if pass, fail, skipped := count("pass"), count("fail"), count("skipped"); pass == "0" || fail != "0" || skipped != "0" {
		t.Fatalf("node tests: %s passed, %s failed, %s skipped\n%s", pass, fail, skipped, out)
	}
	t.Logf("node tests passed: %s", count("pass"))
}
