// Package changelists holds tests that keep docs/design.md and the
// repository's comments true: the "Three common changes" lists are made in a
// scratch copy of the tree, step by step, and must build and pass the tests
// that guard each change; and every file a comment or doc cites must exist.
// It has no code of its own.
package changelists
