package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestContainerFiles holds the Dockerfile and docker-compose.yml to what
// issue 13 asks of them (docker itself may be missing where tests run):
// the build image is go.mod's exact Go version, with cache mounts and the
// version stamp; the image checks itself with `creditd healthcheck`; compose
// publishes on the loopback only, requires the admin token from the
// environment and health-checks every creditd.
func TestContainerFiles(t *testing.T) {
	t.Parallel()
	read := func(name string) string {
		b, err := os.ReadFile("../../" + name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	gomod, dockerfile, compose := read("go.mod"), read("Dockerfile"), read("docker-compose.yml")
	goVersion := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(gomod)
	if goVersion == nil {
		t.Fatal("go.mod has no go line")
	}
	for _, want := range []string{
		"ARG GO_VERSION=" + goVersion[1] + "\n",
		"FROM golang:${GO_VERSION}-",
		"GOTOOLCHAIN=local",
		"--mount=type=cache,target=/go/pkg/mod",
		"--mount=type=cache,target=/root/.cache/go-build",
		"-X main.version=${VERSION} -X main.commit=${COMMIT} -X main.date=${BUILD_DATE}",
		`CMD ["creditd", "healthcheck"`,
	} {
		if !strings.Contains(dockerfile, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	if n := strings.Count(dockerfile, "\nFROM "); n != 2 {
		t.Errorf("Dockerfile has %d stages, want a build and a runtime stage", n)
	}

	ports := regexp.MustCompile(`(?m)^\s+ports:\n((?:\s+- .*\n)+)`).FindAllStringSubmatch(compose, -1)
	if len(ports) == 0 {
		t.Fatal("docker-compose.yml publishes no ports")
	}
	for _, p := range ports {
		for _, line := range strings.Split(strings.TrimSpace(p[1]), "\n") {
			if !strings.HasPrefix(strings.Trim(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "-")), `"`), "127.0.0.1:") {
				t.Errorf("docker-compose.yml publishes %q beyond the loopback", strings.TrimSpace(line))
			}
		}
	}
	tokens := regexp.MustCompile(`(?m)^\s+CREDITD_ADMIN_TOKEN: (.*)$`).FindAllStringSubmatch(compose, -1)
	if len(tokens) == 0 {
		t.Fatal("docker-compose.yml sets no CREDITD_ADMIN_TOKEN")
	}
	for _, tok := range tokens {
		if !strings.HasPrefix(tok[1], "${CREDITD_ADMIN_TOKEN:?") {
			t.Errorf("docker-compose.yml's CREDITD_ADMIN_TOKEN is %q: it must be required from the environment, no default", tok[1])
		}
	}
	if !strings.Contains(compose, `test: ["CMD", "creditd", "healthcheck"`) ||
		strings.Count(compose, "healthcheck: *creditd-healthcheck") < 2 {
		t.Error("docker-compose.yml does not health-check creditd (default stack and fleet) with creditd healthcheck")
	}
}
