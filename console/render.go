package console

import (
	"bytes"
	"encoding/json"
	"html/template"
	"io/fs"
	"net/http"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/creditd/creditd/engine"
)

// pageTemplate is the layout with one page's content.
type pageTemplate struct{ t *template.Template }

var funcs = template.FuncMap{
	"credits": formatCredits,
	"when":    formatTime,
	"whenp": func(t *time.Time) string {
		if t == nil {
			return "never"
		}
		return formatTime(*t)
	},
	"deref": func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	},
	"derefInt": func(n *int) string {
		if n == nil {
			return "—"
		}
		return strconv.Itoa(*n)
	},
	"metadata": formatMetadata,
	"inc":      func(i int) int { return i + 1 },
	// formKey is a fresh key per rendered create form (onceOnly).
	"formKey": randomToken,
	"here":    strings.HasPrefix,
	"webhookForm": func(t engine.Tenant, csrf, back string) webhookForm {
		return webhookForm{Tenant: t, CSRF: csrf, Back: back}
	},
	"signed": func(mc int64) string {
		if mc > 0 {
			return "+" + formatCredits(mc)
		}
		return formatCredits(mc)
	},
}

// parsePages parses the layout with each page template.
func parsePages() map[string]*pageTemplate {
	layout := template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/_*.html"))
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		panic(err)
	}
	out := map[string]*pageTemplate{}
	for _, n := range names {
		base := path.Base(n)
		if base == "layout.html" || strings.HasPrefix(base, "_") {
			continue
		}
		t := template.Must(template.Must(layout.Clone()).ParseFS(templateFS, n))
		out[strings.TrimSuffix(base, ".html")] = &pageTemplate{t: t}
	}
	return out
}

// view is what the layout renders around a page.
type view struct {
	Title string
	// Signed is false on the sign-in page.
	Signed   bool
	Operator bool
	CSRF     string
	Flash    *flash
	// Scope is the tenant and environment the page is about (nil: none).
	Scope *scopeView
	// Refresh, when > 0, reloads the page every so many seconds (meta
	// refresh: no script needed).
	Refresh int
	Data    any
	// Path is the request path, to mark the current navigation link.
	Path string
	// DeadLetters is the count of unresolved dead letters, shown to the
	// operator as a banner on every page while it is above 0 (issue 25:
	// a dead letter is an alarm, never a readiness failure).
	DeadLetters int64
}

// scopeView names the tenant and environment in the navigation.
type scopeView struct {
	TenantID, TenantName string
	Env                  string
	// Base is the scoped URL prefix, /console/t/{tenant}/{env}.
	Base string
	// Tenant is the tenant itself (the operator's webhook form).
	Tenant engine.Tenant
}

// render writes page with data inside the layout.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, page, title string, data any, refresh int) {
	v := view{Title: title, Data: data, Refresh: refresh, Path: r.URL.Path}
	if p := principalOf(r); p != nil {
		v.Signed, v.Operator, v.CSRF = true, p.operator, p.session.CSRF
		v.Flash = c.takeFlash(w, r)
		if p.operator {
			v.DeadLetters = c.deadLetters(r)
		}
		if p.scope.TenantID != [16]byte{} {
			name := p.tenant.Name
			v.Scope = &scopeView{
				TenantID: p.scope.TenantID.String(), TenantName: name, Env: string(p.scope.Environment),
				Base:   Prefix + "/t/" + p.scope.TenantID.String() + "/" + string(p.scope.Environment),
				Tenant: p.tenant,
			}
		}
	}
	var buf bytes.Buffer
	pt := c.pages[page]
	if err := pt.t.ExecuteTemplate(&buf, "layout.html", v); err != nil {
		c.cfg.Log.Error().Err(err).Str("page", page).Msg("console: render")
		http.Error(w, "the page could not be drawn", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// deadLetters counts the unresolved dead letters for the operator's
// banner (one indexed count; the operator's pages are few). A count that
// fails shows no banner: the metric and the alert still carry the alarm.
func (c *Console) deadLetters(r *http.Request) int64 {
	if c.cfg.Directory == nil {
		return 0
	}
	n, err := c.cfg.Directory.UnresolvedDeadLetters(r.Context())
	if err != nil {
		c.cfg.Log.Warn().Err(err).Str("path", r.URL.Path).Msg("console: dead letters not counted; no banner")
		return 0
	}
	return n
}

// fail renders an error page with status and a message meant for the user.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.render(w, r, status, "error", http.StatusText(status), msg, 0)
}

// notFound is the one answer for a page that does not exist or is not
// the signed-in user's to see.
func (c *Console) notFound(w http.ResponseWriter, r *http.Request) {
	c.fail(w, r, http.StatusNotFound, "There is nothing here, or it is not yours to see.")
}

// engineError renders an engine error with its status; an unexpected
// failure is logged and shown without its text.
func (c *Console) engineError(w http.ResponseWriter, r *http.Request, err error) {
	e, ok := engine.AsError(err)
	if !ok || e.Kind == engine.KindInternal && !e.Documented {
		c.cfg.Log.Error().Err(err).Str("path", r.URL.Path).Msg("console: engine call failed")
		c.fail(w, r, http.StatusInternalServerError, "Something went wrong on our side; it has been logged.")
		return
	}
	status := map[engine.Kind]int{
		engine.KindBadRequest: 400, engine.KindNotFound: 404, engine.KindConflict: 409,
		engine.KindInsufficientCredits: 409, engine.KindReservationExpired: 409, engine.KindValidation: 422,
		engine.KindUnauthorized: 401, engine.KindRateLimited: 429, engine.KindUnavailable: 503,
	}[e.Kind]
	if status == 0 {
		status = http.StatusInternalServerError
	}
	if status == http.StatusNotFound {
		c.notFound(w, r)
		return
	}
	msg := e.Detail
	if e.Field != "" {
		msg = e.Field + ": " + msg
	}
	c.fail(w, r, status, msg)
}

// back sets a one-time message and sends the browser to to (POST, then
// redirect, then GET: a reload never posts twice).
func (c *Console) back(w http.ResponseWriter, r *http.Request, to string, f flash) {
	f.ExpiresUnix = c.cfg.Clock.Now().Add(flashTTL).Unix()
	setCookie(w, r, flashCookie, c.sealer.seal(flashCookie, f), int(flashTTL.Seconds()))
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// takeFlash reads the one-time message, if any, and has the browser drop
// it: a reload shows the page without it (a key is shown once).
func (c *Console) takeFlash(w http.ResponseWriter, r *http.Request) *flash {
	ck, err := r.Cookie(flashCookie)
	if err != nil {
		return nil
	}
	setCookie(w, r, flashCookie, "", -1)
	f := new(flash)
	if !c.sealer.open(flashCookie, ck.Value, f) || c.cfg.Clock.Now().Unix() >= f.ExpiresUnix {
		return nil
	}
	return f
}

// backErr is back with an engine error's detail (or a generic one).
func (c *Console) backErr(w http.ResponseWriter, r *http.Request, to string, err error) {
	msg := "Something went wrong on our side; it has been logged."
	if e, ok := engine.AsError(err); ok && (e.Kind != engine.KindInternal || e.Documented) {
		msg = e.Detail
		if e.Field != "" {
			msg = e.Field + ": " + msg
		}
	} else {
		c.cfg.Log.Error().Err(err).Str("path", r.URL.Path).Msg("console: engine call failed")
	}
	c.back(w, r, to, flash{Message: msg, Error: true})
}

// formatCredits shows millicredits as credits with three decimals and
// thousands separators: 1234500 -> "1,234.500".
func formatCredits(mc int64) string {
	neg := mc < 0
	u := uint64(mc)
	if neg {
		u = uint64(-mc) // -minInt64 wraps to itself, which is still its magnitude as uint64
	}
	whole, frac := u/1000, u%1000
	s := strconv.FormatUint(whole, 10)
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, ch := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(ch)
	}
	b.WriteByte('.')
	f := strconv.FormatUint(frac, 10)
	b.WriteString(strings.Repeat("0", 3-len(f)) + f)
	return b.String()
}

// parseCredits reads a credits amount with up to three decimals into
// millicredits: "1.5" -> 1500. ok is false for anything else or <= 0.
func parseCredits(s string) (int64, bool) {
	s = strings.TrimSpace(strings.ReplaceAll(s, ",", ""))
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" || len(frac) > 3 || len(whole) > 15 {
		return 0, false
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || w < 0 {
		return 0, false
	}
	var f int64
	if frac != "" {
		if f, err = strconv.ParseInt(frac+strings.Repeat("0", 3-len(frac)), 10, 64); err != nil || f < 0 {
			return 0, false
		}
	}
	mc := w*1000 + f
	return mc, mc > 0
}

func formatTime(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") }

// metaPair is one metadata key and its JSON value as text.
type metaPair struct{ Key, Value string }

// formatMetadata lists metadata sorted by key; values are their JSON text
// (strings unquoted), escaped by the template like every tenant value.
func formatMetadata(m engine.Metadata) []metaPair {
	out := make([]metaPair, 0, len(m))
	for k, v := range m {
		var s string
		if json.Unmarshal(v, &s) != nil {
			s = string(v)
		}
		out = append(out, metaPair{k, s})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// webhookForm is the data of the webhook URL and rotation forms.
type webhookForm struct {
	Tenant     engine.Tenant
	CSRF, Back string
}
