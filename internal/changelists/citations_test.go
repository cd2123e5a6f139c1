package changelists

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// repoRoot is the module's root: this package sits two levels below it.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", root, err)
	}
	return root
}

// skipDir says which directories hold no text of ours: dependencies,
// local state and build output.
func skipDir(rel string) bool {
	switch filepath.Base(rel) {
	case ".git", "node_modules", ".data", "bin", "dist":
		return true
	}
	return false
}

// generated says which files a generator writes: their text is the
// generator's (itself scanned), and docs/api.md is api/openapi.json's.
func generated(rel string) bool {
	return strings.HasSuffix(rel, "_gen.go") || strings.HasSuffix(rel, ".pb.go")
}

// citation is a file path as prose names it: a relative path or bare name
// ending in an extension of a file kind this repository holds. The match
// must not continue a longer word, URL or path (checked by the caller on
// the byte before it).
var citation = regexp.MustCompile(`(?:\.\.?/)*[A-Za-z0-9_][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_.-]+)*\.(?:md|go|lua|sql|sh|mjs|ts|py|ya?ml)\b`)

// TestCitationsResolve: every file a comment (*.go, *.lua) or a document
// (*.md) cites exists in this repository, so a reader can open what a
// rule points to (issue 29: comments cited spec files kept outside it).
// A path resolves against the repository root, the citing file's
// directory or any directory above it, or docs/; a bare file name against
// any file of that name.
func TestCitationsResolve(t *testing.T) {
	root := repoRoot(t)
	names := map[string]bool{}
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if rel != "." && skipDir(rel) {
				return filepath.SkipDir
			}
			return nil
		}
		names[d.Name()] = true
		switch filepath.Ext(p) {
		case ".go", ".lua", ".md":
			if !generated(rel) {
				files = append(files, rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	exists := func(p string) bool { _, err := os.Stat(filepath.Join(root, p)); return err == nil }
	resolves := func(from, p string) bool {
		if !strings.Contains(p, "/") && names[p] {
			return true
		}
		for dir := filepath.Dir(from); ; dir = filepath.Dir(dir) {
			if exists(filepath.Join(dir, p)) {
				return true
			}
			if dir == "." || dir == "/" {
				break
			}
		}
		return exists(filepath.Join("docs", p))
	}
	var bad []string
	for _, rel := range files {
		text, err := prose(filepath.Join(root, rel))
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			continue
		}
		for _, loc := range citation.FindAllStringIndex(text, -1) {
			if loc[0] > 0 && strings.ContainsRune("/.:@-_~", rune(text[loc[0]-1])) ||
				loc[0] > 0 && isWordByte(text[loc[0]-1]) {
				continue
			}
			p := text[loc[0]:loc[1]]
			if patternPath(text, loc[0], p) {
				continue
			}
			if !resolves(rel, p) {
				bad = append(bad, rel+": "+p)
			}
		}
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Errorf("cites a file not in this repository: %s", b)
	}
	for _, b := range badSections(t, root, files) {
		t.Errorf("cites a part of the contract that is not there: %s", b)
	}
}

// specRef is a citation of a part of the contract in docs/spec: a numbered
// section of the addendum (§7; the interface has no numbers) or a named
// part of either ("Metering rule").
var specRef = regexp.MustCompile(`(interface|addendum)\.md (?:§(\d+)|"([^"\n]+)")`)

// badSections lists the citations of docs/spec parts that do not exist, so
// a section number past the last or a renamed heading cannot send a reader
// nowhere.
func badSections(t *testing.T, root string, files []string) []string {
	spec := map[string]string{}
	for _, name := range []string{"interface", "addendum"} {
		b, err := os.ReadFile(filepath.Join(root, "docs", "spec", name+".md"))
		if err != nil {
			t.Fatal(err)
		}
		spec[name] = string(b)
	}
	var bad []string
	for _, rel := range files {
		text, err := prose(filepath.Join(root, rel))
		if err != nil {
			continue
		}
		for _, m := range specRef.FindAllStringSubmatch(text, -1) {
			doc := spec[m[1]]
			switch {
			case m[2] != "" && (m[1] != "addendum" || !strings.Contains(doc, "\n## "+m[2]+". ")):
				bad = append(bad, rel+": "+m[0])
			case m[3] != "" && !strings.Contains(doc, m[3]):
				bad = append(bad, rel+": "+m[0])
			}
		}
	}
	sort.Strings(bad)
	return bad
}

// patternPath says whether p, at i in text, is a pattern or an
// expression rather than a file: "api/<family>_test.go" (p is its tail),
// "NNN_slug.up.sql", "o.Out/latest.md", "github.com/x/y.go".
func patternPath(text string, i int, p string) bool {
	if i > 0 && strings.ContainsRune("<>*{}", rune(text[i-1])) || strings.HasPrefix(p, "NNN") {
		return true
	}
	dirs := strings.Split(p, "/")
	for _, d := range dirs[:len(dirs)-1] {
		if d != "." && d != ".." && strings.Contains(d, ".") {
			return true
		}
	}
	return false
}

func isWordByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9'
}

// prose is what a file says to a reader: a Go file's comments, a Lua
// file's comments, a Markdown file whole.
func prose(path string) (string, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	switch filepath.Ext(path) {
	case ".go":
		f, err := parser.ParseFile(token.NewFileSet(), path, src, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return "", err
		}
		var b strings.Builder
		for _, g := range f.Comments {
			for _, c := range g.List {
				b.WriteString(c.Text)
				b.WriteByte('\n')
			}
		}
		return b.String(), nil
	case ".lua":
		var b strings.Builder
		for _, line := range strings.Split(string(src), "\n") {
			if i := strings.Index(line, "--"); i >= 0 {
				b.WriteString(line[i+2:])
				b.WriteByte('\n')
			}
		}
		return b.String(), nil
	}
	return string(src), nil
}
