package changelists

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestOnePackageDoc: in each package at most one file's comment is attached
// to its package clause, so go doc shows the package's own doc rather than
// file headers run together after it (issue 29 found ten engine files whose
// headers joined the package doc, one with a literal \n); a file's header is
// separated from "package" by a blank line.
func TestOnePackageDoc(t *testing.T) {
	root := repoRoot(t)
	docs := map[string][]string{} // directory and package name -> files with a package doc
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if rel != "." && (skipDir(rel) || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		if f.Doc == nil {
			return nil
		}
		if strings.Contains(f.Doc.Text(), `\n`) {
			t.Errorf("%s: its package doc holds a literal \\n", rel)
		}
		key := filepath.Dir(rel) + " " + f.Name.Name
		docs[key] = append(docs[key], filepath.Base(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range docs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if files := docs[k]; len(files) > 1 {
			dir, pkg, _ := strings.Cut(k, " ")
			t.Errorf("%s/ package %s: %d files attach a comment to the package clause (%s); keep the package doc in one and separate the other headers from \"package\" by a blank line",
				dir, pkg, len(files), strings.Join(files, ", "))
		}
	}
}
