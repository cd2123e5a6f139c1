package changelists

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// change is one of docs/design.md's "Three common changes", made for
// real: the steps a developer follows from the list, each under the name
// the list must give it (a file, or a command), then the tests that show
// the change is whole.
type change struct {
	// heading is the list's bold title in docs/design.md.
	heading string
	steps   []step
	// probes are test files written into the scratch copy: they exercise
	// the new thing end to end (price with it, fire it, call it), so a
	// step the list forgot shows as a failure, not only as a missing name.
	probes map[string]string
	// vet and test are the packages to vet and the go test -run pattern
	// and packages: the probes and the tests that guard the change.
	vet      []string
	run      string
	testPkgs []string
	// checks are further commands that must pass (generators' --check).
	checks []command
}

// step is one item of a list: name is the file or command the list must
// name in backquotes; apply makes that part of the change in the copy.
type step struct {
	name  string
	apply func(s *scratch) error
}

type command struct {
	args []string
	// ts: the command needs the TypeScript client's npm packages; without
	// them (no npm ci there) it is skipped, logged.
	ts bool
}

// TestChangeListsAreExecutable makes each change of docs/design.md's
// "Three common changes, and where each one lands" in a scratch copy of
// the tree, following only its list: every step must be named by the list
// (a list that forgets a file fails here), and a step the list does not
// name is left out, so the build, the probes and the guarding tests fail
// as they would for a developer who trusted the list (issue 29).
func TestChangeListsAreExecutable(t *testing.T) {
	goBin := findGo()
	if goBin == "" {
		t.Skip("go is not installed: the change lists are checked by building a scratch copy")
	}
	if os.Getenv("TEST_REDIS_CLUSTER") != "" {
		// make test's second phase: the lists and the code are what they
		// were in the first, and nothing here depends on Redis' topology.
		t.Skip("run once per make test, in the single-Redis phase")
	}
	root := repoRoot(t)
	design, err := os.ReadFile(filepath.Join(root, "docs", "design.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range changes() {
		t.Run(strings.ReplaceAll(ch.heading, " ", "_"), func(t *testing.T) {
			list, err := listOf(string(design), ch.heading)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			if err := copyTree(root, dir); err != nil {
				t.Fatal(err)
			}
			s := &scratch{t: t, dir: dir, root: root, goBin: goBin}
			start := time.Now()
			for _, st := range ch.steps {
				if !names(list, st.name) {
					t.Errorf("docs/design.md %q does not name `%s`: the change is not whole without it (left out below)", ch.heading, st.name)
					continue
				}
				if err := st.apply(s); err != nil {
					// The steps after it may still run: report them all.
					t.Errorf("step `%s`: %v", st.name, err)
				}
			}
			for rel, src := range ch.probes {
				if err := os.WriteFile(filepath.Join(dir, rel), []byte(src), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.goCmd(append([]string{"vet"}, ch.vet...)...); err != nil {
				t.Errorf("go vet: %v", err)
			}
			args := append([]string{"test", "-count=1", "-short", "-run", ch.run}, ch.testPkgs...)
			if err := s.goCmd(args...); err != nil {
				t.Errorf("go test: %v", err)
			}
			for _, c := range ch.checks {
				if c.ts && !s.nodeModules() {
					t.Logf("skipped `%s`: clients/typescript/node_modules is missing", strings.Join(c.args, " "))
					continue
				}
				if err := s.cmd(c.args...); err != nil {
					t.Errorf("%s: %v", strings.Join(c.args, " "), err)
				}
			}
			t.Logf("%s: made and checked in %s", ch.heading, time.Since(start).Round(time.Second))
		})
	}
}

// findGo is the go command: on PATH, or where the Makefile also looks.
func findGo() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/local/go/bin/go"); err == nil {
		return "/usr/local/go/bin/go"
	}
	return ""
}

// listOf is the text of the list titled heading: from its bold title to
// the next list or section.
func listOf(design, heading string) (string, error) {
	start := strings.Index(design, "**"+heading)
	if start < 0 {
		return "", fmt.Errorf("docs/design.md has no list %q", heading)
	}
	rest := design[start+2:]
	end := len(rest)
	for _, stop := range []string{"\n**Adding ", "\n## "} {
		if i := strings.Index(rest, stop); i >= 0 && i < end {
			end = i
		}
	}
	return rest[:end], nil
}

// names says whether list names what in backquotes, alone or followed by
// a symbol (`engine/pricing.go` `Price`, `api/server.go` register).
func names(list, what string) bool {
	return regexp.MustCompile("`" + regexp.QuoteMeta(what) + "[` ]").MatchString(list)
}

// copyTree copies the work tree, uncommitted edits included, without what
// the build does not read: git's store, dependencies and local state.
func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		dst := filepath.Join(to, rel)
		if d.IsDir() {
			if rel != "." && (skipDir(rel) || rel == filepath.Join("bench", "results")) {
				return filepath.SkipDir
			}
			return os.MkdirAll(dst, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		info, err := d.Info()
		if err != nil {
			return err
		}
		out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, info.Mode().Perm())
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, src); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}

// scratch is the copy a change is made in.
type scratch struct {
	t     *testing.T
	dir   string
	root  string
	goBin string
}

func (s *scratch) path(rel string) string { return filepath.Join(s.dir, filepath.FromSlash(rel)) }

func (s *scratch) exists(rel string) bool {
	_, err := os.Stat(s.path(rel))
	return err == nil
}

// edit applies replacements to file rel; each old text must occur exactly
// once, so an edit lands where the list says or fails saying where.
func (s *scratch) edit(rel string, rs ...repl) error {
	b, err := os.ReadFile(s.path(rel))
	if err != nil {
		return err
	}
	text := string(b)
	for _, r := range rs {
		switch n := strings.Count(text, r.old); n {
		case 1:
			text = strings.Replace(text, r.old, r.new, 1)
		case 0:
			return fmt.Errorf("%s: anchor not found (the code moved; update the list and this test): %q", rel, r.old)
		default:
			return fmt.Errorf("%s: anchor found %d times: %q", rel, n, r.old)
		}
	}
	return os.WriteFile(s.path(rel), []byte(text), 0o644)
}

// appendTo adds text at the end of file rel.
func (s *scratch) appendTo(rel, text string) error {
	b, err := os.ReadFile(s.path(rel))
	if err != nil {
		return err
	}
	return os.WriteFile(s.path(rel), append(b, text...), 0o644)
}

// openapi edits api/openapi.json as a document, keeping its form.
func (s *scratch) openapi(f func(doc *jnode) error) error {
	p := s.path("api/openapi.json")
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	doc, err := parseJSON(b)
	if err != nil {
		return err
	}
	if err := f(doc); err != nil {
		return fmt.Errorf("api/openapi.json: %w", err)
	}
	return os.WriteFile(p, doc.encode(), 0o644)
}

// repl replaces old by new.
type repl struct{ old, new string }

// after inserts text after anchor; before, before it.
func after(anchor, text string) repl  { return repl{anchor, anchor + text} }
func before(anchor, text string) repl { return repl{anchor, text + anchor} }

// goCmd runs the go command in the copy.
func (s *scratch) goCmd(args ...string) error { return s.cmd(append([]string{s.goBin}, args...)...) }

// cmd runs a command in the copy, its output logged on failure.
func (s *scratch) cmd(args ...string) error {
	// A bound against a hang, not a timing: under make test the copy's
	// builds share two cores with the rest of the suite.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	name := args[0]
	if name == "go" {
		name = s.goBin
	}
	c := exec.CommandContext(ctx, name, args[1:]...)
	c.Dir = s.dir
	// The copy has no .git: no VCS stamp. Its go.work, if any, is its own.
	c.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false", "GOWORK=off")
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	t0 := time.Now()
	err := c.Run()
	s.t.Logf("%s (%s)", strings.Join(args, " "), time.Since(t0).Round(100*time.Millisecond))
	if err != nil {
		return fmt.Errorf("%w\n%s", err, tail(out.String(), 60))
	}
	return nil
}

// runStep is a step that runs a command the list names.
func runStep(args ...string) step {
	return step{name: strings.Join(args, " "), apply: func(s *scratch) error { return s.cmd(args...) }}
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = append([]string{"..."}, l[len(l)-lines:]...)
	}
	return strings.Join(l, "\n")
}
