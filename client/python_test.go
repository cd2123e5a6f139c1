package client_test

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/creditd/creditd/internal/e2e"
	"github.com/creditd/creditd/internal/testenv"
)

// pythonDir is the Python client's package.
const pythonDir = "../clients/python"

// TestPythonClient starts creditd and runs the Python client's unittest
// suite against it (CREDITD_URL, CREDITD_ADMIN_TOKEN): the generated files
// are checked against api/openapi.json, the retry policy against a scripted
// server, and the live tests drive a real tenant. The client is standard
// library only, so nothing is installed; it is skipped only where python3
// is not installed, and in the Redis Cluster phase of make test, which
// would only run the same Python tests again.
func TestPythonClient(t *testing.T) {
	if len(testenv.ClusterSeeds()) > 0 {
		t.Skip("the Python client's tests run in the single-Redis phase")
	}
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed: the Python client's tests are skipped")
	}
	// NotRequired in the generated TypedDicts is Python 3.11's (Debian
	// bookworm's python3).
	if out, err := exec.Command(python, "-c", "import sys; sys.exit(sys.version_info < (3, 11))").CombinedOutput(); err != nil {
		t.Fatalf("the Python client needs python3 3.11 or later: %v %s", err, out)
	}
	s := e2e.NewStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-m", "unittest", "discover", "-v")
	cmd.Dir = pythonDir
	// No __pycache__ in the source tree.
	cmd.Env = append(os.Environ(), "CREDITD_URL="+s.URL, "CREDITD_ADMIN_TOKEN="+e2e.AdminToken, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 -m unittest discover in clients/python: %v\n%s", err, out)
	}
	// unittest closes with "Ran N tests" and "OK", "OK (skipped=K)" when
	// some skipped: every test ran, none was skipped (the live ones skip
	// without CREDITD_URL).
	ran := regexp.MustCompile(`(?m)^Ran (\d+) tests? in `).FindSubmatch(out)
	if ran == nil || string(ran[1]) == "0" || !regexp.MustCompile(`(?m)^OK$`).Match(out) {
		t.Fatalf("python tests did not all run and pass:\n%s", out)
	}
	t.Logf("python tests passed: %s", ran[1])
}
