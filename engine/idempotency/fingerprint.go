package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
)

// Fingerprint is the request hash: sha256 hex of the environment (sandbox
// or live), method, raw path and body, so a reused key on another path,
// with another body, or with the other environment's API key is told apart
// (the record itself is keyed by tenant and key alone,
// docs/spec/addendum.md §12). It allocates only the string it returns.
func Fingerprint(sandbox bool, method, path, body []byte) string {
	h := sha256.New()
	h.Write(envTag(sandbox))
	h.Write(method)
	h.Write([]byte{' '})
	h.Write(path)
	h.Write([]byte{'\n'})
	h.Write(body)
	var sum [sha256.Size]byte
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], h.Sum(sum[:0]))
	return string(out[:])
}

var (
	tagLive    = []byte("live ")
	tagSandbox = []byte("sandbox ")
)

// envTag is the environment as the fingerprint's first words, without an
// allocation.
func envTag(sandbox bool) []byte {
	if sandbox {
		return tagSandbox
	}
	return tagLive
}

// statusTooManyRequests is HTTP 429.
const statusTooManyRequests = 429

// storable reports whether a response under a claimed key is the request's
// final answer: 2xx and 4xx are (a 409 insufficient-credits stays the answer
// to that key even after a top-up: a new attempt takes a new key); 429 and
// 5xx are not (the request did not run to its end, so a retry must run). A
// 409 "still in progress" never gets here: it is answered before a claim.
func storable(status int) bool {
	return status >= 200 && status < 500 && status != statusTooManyRequests && (status < 300 || status >= 400)
}

// contentTypeOf is ct as a string, without an allocation for the two types
// the API answers with.
func contentTypeOf(ct []byte) string {
	switch string(ct) {
	case "application/json":
		return "application/json"
	case "application/problem+json":
		return "application/problem+json"
	}
	return string(ct)
}
