package console

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
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
	// flashTTL is how long a one-time message waits for the next page.
	flashTTL = time.Minute
	// sessionCookie names the session cookie, flashCookie the one-time
	// message's, preCookie the sign-in form's double-submit CSRF cookie.
	sessionCookie = "creditd_console"
	flashCookie   = "creditd_console_flash"
	preCookie     = "creditd_console_signin"
	// signinFailures is how many failed sign-ins one client address may
	// make per signinWindow before it must wait out the window.
	signinFailures = 10
	signinWindow   = time.Minute
	maxSigninIPs   = 10_000
)

// session is one signed-in browser, sealed into its cookie (AES-GCM), so any
// node of a fleet can read it. A tenant's key is authenticated again on
// every request, so revoking it signs the browser out at once.
type session struct {
	Operator bool   `json:"o,omitempty"`
	APIKey   string `json:"k,omitempty"`
	CSRF     string `json:"c"`
	// ExpiresUnix is when the sign-in ends (unix seconds).
	ExpiresUnix int64 `json:"e"`
}

// flash is a one-time message; Secret, when set, is a value shown only now.
type flash struct {
	Message string `json:"m"`
	Secret  string `json:"s,omitempty"`
	Error   bool   `json:"e,omitempty"`
	// ExpiresUnix bounds how long it waits to be shown (unix seconds).
	ExpiresUnix int64 `json:"x"`
}

// sealer seals values into cookie text and opens them, with AES-256-GCM
// under a key every node derives from the admin token (or, without one, a
// random key of this process). Safe for concurrent use.
type sealer struct{ aead cipher.AEAD }

// sessionKeyLabel separates the cookie key from any other use of the
// admin token.
const sessionKeyLabel = "creditd console session key v1"

func newSealer(adminToken string) *sealer {
	var key []byte
	if adminToken != "" {
		m := hmac.New(sha256.New, []byte(adminToken))
		m.Write([]byte(sessionKeyLabel))
		key = m.Sum(nil)
	} else {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			panic(err) // crypto/rand never fails on supported platforms
		}
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		panic(err) // a 32-byte key always makes a cipher
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return &sealer{aead: aead}
}

// seal encrypts v's JSON under name (the cookie name is authenticated too,
// so a flash cookie cannot stand in for a session).
func (s *sealer) seal(name string, v any) string {
	plain, err := json.Marshal(v)
	if err != nil {
		panic(err) // session and flash always encode
	}
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(s.aead.Seal(nonce, nonce, plain, []byte(name)))
}

// open decrypts text sealed under name into v; false when it was not
// sealed by this key or was changed.
func (s *sealer) open(name, text string, v any) bool {
	raw, err := base64.RawURLEncoding.DecodeString(text)
	if err != nil || len(raw) < s.aead.NonceSize() {
		return false
	}
	n := s.aead.NonceSize()
	plain, err := s.aead.Open(nil, raw[:n], raw[n:], []byte(name))
	return err == nil && json.Unmarshal(plain, v) == nil
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

// SignOuts remembers the sessions that signed out until they would have
// expired (lua.Store keeps them in Redis, shared by a fleet).
type SignOuts interface {
	// SignOut revokes session id until until.
	SignOut(ctx context.Context, id string, until time.Time) error
	// SignedOut reports whether session id was revoked.
	SignedOut(ctx context.Context, id string) (bool, error)
}

// authenticate resolves the request's session into a principal; nil when
// signed out (here or on another node, with a copy of the cookie), when
// that cannot be told (Redis down: fail closed), or when the key was
// revoked. A session's CSRF token is its id: random per sign-in, never
// shown outside the session's own pages.
func (c *Console) authenticate(r *http.Request) *principal {
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil
	}
	ss := new(session)
	if !c.sealer.open(sessionCookie, ck.Value, ss) || c.cfg.Clock.Now().Unix() >= ss.ExpiresUnix || ss.CSRF == "" {
		return nil
	}
	if c.cfg.SignOuts != nil {
		if out, err := c.cfg.SignOuts.SignedOut(r.Context(), ss.CSRF); err != nil || out {
			if err != nil {
				c.cfg.Log.Warn().Err(err).Msg("console: could not tell whether a session signed out; treating it as signed out")
			}
			return nil
		}
	}
	if ss.Operator {
		if c.cfg.AdminToken == "" {
			return nil
		}
		return &principal{session: ss, operator: true}
	}
	scope, tenant, err := c.cfg.Tenants.Authenticate(r.Context(), ss.APIKey)
	if err != nil {
		return nil
	}
	return &principal{session: ss, scope: scope, tenant: tenant}
}

// signedIn runs h for a signed-in request with a valid CSRF token on POST;
// others go to the sign-in page.
func (c *Console) signedIn(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
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
			if subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(p.session.CSRF)) != 1 {
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
