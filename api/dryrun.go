package api

import (
	"bytes"
	"encoding/json"
)

// dryRunMember is what a body asking for a dry run must contain; most
// bodies do not, and pay only this search.
var dryRunMember = []byte(`"dry_run"`)

// dryRunAsked reports whether body has a top-level dry_run member that is
// not false or null: such a request changes nothing, so it needs no
// Idempotency-Key and claims none. A dry_run that is not a boolean counts
// too, so the endpoint answers 422 naming dry_run rather than idempotency
// asking for a key first. A body that is not a JSON object asks for none
// (the endpoint's decoder refuses it as usual).
func dryRunAsked(body []byte) bool {
	if !bytes.Contains(body, dryRunMember) {
		return false
	}
	var top struct {
		DryRun json.RawMessage `json:"dry_run"`
	}
	if err := json.Unmarshal(body, &top); err != nil {
		return false
	}
	v := bytes.TrimSpace(top.DryRun)
	return len(v) > 0 && !bytes.Equal(v, []byte("false")) && !bytes.Equal(v, []byte("null"))
}
