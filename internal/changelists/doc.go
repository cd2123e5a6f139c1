// Package changelists holds tests that keep docs/design.md and the
// repository's comments true: the "Three common changes" lists are made in a
// scratch copy of the tree, step by step, and must build and pass the tests
// that guard each change; every file a comment or doc cites must exist; and
// each package's doc is one file's, not file headers run together. It has
// no code of its own.
package changelists
