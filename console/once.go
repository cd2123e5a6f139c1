package console

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"sort"
	"time"

	"github.com/creditd/creditd/engine/idempotency"
)

// Form keys (issue 31 item 4): a create form carries a fresh random key
// (template func formKey), so a double click or a resubmit creates one
// thing. The key is remembered in the API's idempotency records, under
// the tenant, for as long as an API key is.
const (
	formKeyMin, formKeyMax = 16, 64
	formClaimTTL           = 30 * time.Second
	// formWait bounds how long a repeat waits for the post that holds its
	// key; formPoll is how often it looks.
	formWait = 10 * time.Second
	formPoll = 20 * time.Millisecond
)

// onceOnly runs create (which returns the success message) at most once per
// form key: the first post runs it and remembers its message; a repeat
// with the same fields shows the same message and creates nothing; a
// repeat while the first still runs says so; the key sent with other
// fields is refused. A post without a key (a page rendered before keys)
// is refused as expired; without records (Config.Idempotency unset: a
// console embedded without Redis) the form runs unguarded, as before.
func (c *Console) onceOnly(w http.ResponseWriter, r *http.Request, to, what string, create func() (string, error)) {
	key := r.PostFormValue("form_key")
	if c.cfg.Idempotency == nil || len(key) < formKeyMin || len(key) > formKeyMax {
		if c.cfg.Idempotency == nil {
			msg, err := create()
			if err != nil {
				c.backErr(w, r, to, err)
				return
			}
			c.back(w, r, to, flash{Message: msg})
			return
		}
		c.back(w, r, to, flash{Message: "The form has expired: reload the page and try again.", Error: true})
		return
	}
	tenant := principalOf(r).scope.TenantID
	key = "console-" + what + "-" + key
	hash := formHash(r)
	// A double click's second post usually comes while the first still
	// runs: it waits for the first's answer (as the API's idempotent
	// does), so the page it lands on says what was created.
	rec, claimed, err := c.cfg.Idempotency.Begin(r.Context(), tenant, key, hash, formClaimTTL)
	for deadline := time.Now().Add(formWait); err == nil && !claimed && !rec.Done && !rec.Mismatch && time.Now().Before(deadline); {
		select {
		case <-r.Context().Done():
			deadline = time.Time{}
			continue
		case <-time.After(formPoll):
		}
		rec, claimed, err = c.cfg.Idempotency.Begin(r.Context(), tenant, key, hash, formClaimTTL)
	}
	switch {
	case err != nil:
		c.backErr(w, r, to, err)
		return
	case !claimed && rec.Mismatch:
		c.back(w, r, to, flash{Message: "This form was sent before with other values: reload the page and try again.", Error: true})
		return
	case !claimed && rec.Done:
		c.back(w, r, to, flash{Message: string(rec.Body)})
		return
	case !claimed:
		c.back(w, r, to, flash{Message: "This form is already being sent: reload the page in a moment."})
		return
	}
	msg, err := create()
	if err != nil {
		if aerr := c.cfg.Idempotency.Abort(r.Context(), tenant, key, hash); aerr != nil {
			c.cfg.Log.Warn().Err(aerr).Msg("console: dropping a form claim failed; it lapses by itself")
		}
		c.backErr(w, r, to, err)
		return
	}
	done := idempotency.Record{Status: http.StatusSeeOther, ContentType: "text/plain", Body: []byte(msg)}
	if err := c.cfg.Idempotency.Finish(r.Context(), tenant, key, hash, done, idempotency.ReplayWindow, false); err != nil {
		c.cfg.Log.Warn().Err(err).Msg("console: remembering a form failed; a resubmit within the claim's life still creates nothing")
	}
	c.back(w, r, to, flash{Message: msg})
}

// formHash fingerprints a form post: its path and every field but the
// per-render ones (csrf), sorted.
func formHash(r *http.Request) string {
	h := sha256.New()
	h.Write([]byte(r.URL.Path))
	names := make([]string, 0, len(r.PostForm))
	for k := range r.PostForm {
		if k != "csrf" {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	for _, k := range names {
		h.Write([]byte("\x00" + url.QueryEscape(k) + "="))
		for _, v := range r.PostForm[k] {
			h.Write([]byte(url.QueryEscape(v) + "&"))
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}
