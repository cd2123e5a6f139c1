package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// Session limits.
const (
	// sessionTTL is how long a sign-in lasts, from the sign-in.
	sessionTTL = 12 * time.Hour
	// maxSessions bounds the sessions one process holds; past it the one
	// closest to expiry is dropped.
	maxSessions = 10_000
	// sessionCookie names the session cookie; preCookie the sign-in form's
	// double-submit CSRF cookie.
	sessionCookie = "creditd_console"
	preCookie     = "creditd_console_signin"
	// signinFailures is how many failed sign-ins one client address may
	// make per signinWindow before it must wait out the window.
	signinFailures = 10
	signinWindow   = time.Minute
	maxSigninIPs   = 10_000
)

// session is one signed-in browser. The credential stays server-side: the
// cookie holds only a random id, and a tenant's key is authenticated again on
// every request, so revoking it signs the browser out at once.
type session struct {
	id       string
	csrf     string
	operator bool
	apiKey   string
	expires  time.Time
	// flash is shown once on the next page (a key or secret shown once).
	flash *flash
}

// flash is a one-time message; Secret, when set, is a value shown only now.
type flash struct {
	Message string
	Secret  string
	Error   bool
}

// sessions is the process' session map. Safe for concurrent use.
type sessions struct {
	mu   sync.Mutex
	byID map[string]*session
}

func newSessions() *sessions { return &sessions{byID: map[string]*session{}} }

// start records a new session.
func (s *sessions) start(now time.Time, operator bool, apiKey string) *session {
	ss := &session{id: randomToken(), csrf: randomToken(), operator: operator, apiKey: apiKey, expires: now.Add(sessionTTL)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.byID) >= maxSessions {
		var oldest *session
		for _, o := range s.byID {
			if now.After(o.expires) {
				delete(s.byID, o.id)
				continue
			}
			if oldest == nil || o.expires.Before(oldest.expires) {
				oldest = o
			}
		}
		if len(s.byID) >= maxSessions && oldest != nil {
			delete(s.byID, oldest.id)
		}
	}
	s.byID[ss.id] = ss
	return ss
}

// get is the live session of id, or nil.
func (s *sessions) get(id string, now time.Time) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.byID[id]
	if ss != nil && now.After(ss.expires) {
		delete(s.byID, id)
		return nil
	}
	return ss
}

// end forgets id.
func (s *sessions) end(id string) {
	s.mu.Lock()
	delete(s.byID, id)
	s.mu.Unlock()
}

// setFlash stores a one-time message on ss; takeFlash reads and clears it.
func (s *sessions) setFlash(ss *session, f flash) {
	s.mu.Lock()
	ss.flash = &f
	s.mu.Unlock()
}

func (s *sessions) takeFlash(ss *session) *flash {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := ss.flash
	ss.flash = nil
	return f
}

// randomToken is 32 random bytes, base64url.
func randomToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// setCookie writes an HttpOnly, SameSite=Strict cookie, Secure when the
// request came over TLS; maxAge < 0 deletes it.
func setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: value, Path: Prefix, MaxAge: maxAge,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
}

// principal is who a request acts as: the operator, or one tenant's scope.
type principal struct {
	session  *session
	operator bool
	scope    engine.Scope
	tenant   engine.Tenant
}

type principalKey struct{}

func principalOf(r *http.Request) *principal {
	p, _ := r.Context().Value(principalKey{}).(*principal)
	return p
}

// authenticate resolves the request's session into a principal; nil when
// signed out (or the key was revoked).
func (c *Console) authenticate(r *http.Request) *principal {
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil
	}
	ss := c.sessions.get(ck.Value, c.cfg.Clock.Now())
	if ss == nil {
		return nil
	}
	if ss.operator {
		if c.cfg.AdminToken == "" {
			return nil
		}
		return &principal{session: ss, operator: true}
	}
	scope, tenant, err := c.cfg.Tenants.Authenticate(r.Context(), ss.apiKey)
	if err != nil {
		if e, ok := engine.AsError(err); ok && e.Kind == engine.KindUnauthorized {
			c.sessions.end(ss.id)
		}
		return nil
	}
	return &principal{session: ss, scope: scope, tenant: tenant}
}

// signedIn runs h for a signed-in request with a valid CSRF token on POST;
// others go to the sign-in page.
func (c *Console) signedIn(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
		defer cancel()
		r = r.WithContext(ctx)
		p := c.authenticate(r)
		if p == nil {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, Prefix+"/login", http.StatusSeeOther)
				return
			}
			c.fail(w, r, http.StatusUnauthorized, "Your session has ended: sign in again.")
			return
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
			if err := r.ParseForm(); err != nil {
				c.fail(w, r, http.StatusBadRequest, "The form could not be read.")
				return
			}
			if subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(p.session.csrf)) != 1 {
				c.fail(w, r, http.StatusForbidden, "The form has expired: reload the page and try again.")
				return
			}
		}
		h(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	}
}

// operator runs h for the operator only; a tenant gets a 404, as for a
// page that does not exist.
func (c *Console) operator(h http.HandlerFunc) http.HandlerFunc {
	return c.signedIn(func(w http.ResponseWriter, r *http.Request) {
		if !principalOf(r).operator {
			c.notFound(w, r)
			return
		}
		h(w, r)
	})
}

// inScope runs h for a page under /t/{tenant}/{env}: the operator may open
// any tenant, a tenant only its own tenant and environment (anything else
// is a 404, so a URL cannot even tell another tenant's data exists).
func (c *Console) inScope(h http.HandlerFunc) http.HandlerFunc {
	return c.signedIn(func(w http.ResponseWriter, r *http.Request) {
		p := principalOf(r)
		id, err := uuid.Parse(r.PathValue("tenant"))
		env := engine.Environment(r.PathValue("env"))
		if err != nil || !env.Valid() {
			c.notFound(w, r)
			return
		}
		if !p.operator {
			if id != p.scope.TenantID || env != p.scope.Environment {
				c.notFound(w, r)
				return
			}
			h(w, r)
			return
		}
		t, err := c.cfg.Tenants.Get(r.Context(), id)
		if err != nil {
			c.engineError(w, r, err)
			return
		}
		scoped := *p
		scoped.tenant = t
		scoped.scope = engine.Scope{TenantID: id, Environment: env}
		h(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, &scoped)))
	})
}

// signinLimiter counts failed sign-ins per client address. Safe for
// concurrent use.
type signinLimiter struct {
	mu    sync.Mutex
	byIP  map[string]*signinWindowCount
	clock func() time.Time
}

type signinWindowCount struct {
	start time.Time
	n     int
}

func newSigninLimiter() *signinLimiter {
	return &signinLimiter{byIP: map[string]*signinWindowCount{}, clock: time.Now}
}

// allowed reports whether addr may try to sign in now.
func (l *signinLimiter) allowed(addr string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.byIP[hostOf(addr)]
	return w == nil || l.clock().Sub(w.start) > signinWindow || w.n < signinFailures
}

// failed counts one failed sign-in of addr.
func (l *signinLimiter) failed(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock()
	ip := hostOf(addr)
	w := l.byIP[ip]
	if w == nil || now.Sub(w.start) > signinWindow {
		if len(l.byIP) >= maxSigninIPs {
			for k, o := range l.byIP {
				if now.Sub(o.start) > signinWindow {
					delete(l.byIP, k)
				}
			}
			if len(l.byIP) >= maxSigninIPs {
				return // a flood of addresses: each stays bounded by the admin and key checks
			}
		}
		w = &signinWindowCount{start: now}
		l.byIP[ip] = w
	}
	w.n++
}

func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}
