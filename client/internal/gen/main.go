// Command gen writes the creditd Go client's types (types_gen.go) and
// operations (operations_gen.go) from api/openapi.json, so the client
// covers every tenant operation with the document's exact schemas. Run it
// through `go generate ./client`; TestGeneratedUpToDate fails when the
// committed files differ from what the document gives.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

func main() {
	spec := flag.String("spec", "../api/openapi.json", "the OpenAPI document")
	out := flag.String("out", ".", "the client package directory")
	flag.Parse()
	data, err := os.ReadFile(*spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
	files, err := generate(data)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(*out, n), files[n], 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "gen:", err)
			os.Exit(1)
		}
	}
}
