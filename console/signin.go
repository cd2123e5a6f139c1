package console

import (
	"crypto/subtle"
	"net/http"
	"strings"
	"time"
)

// home sends the operator to the tenants and a tenant to its customers.
func (c *Console) home(w http.ResponseWriter, r *http.Request) {
	p := c.authenticate(r)
	switch {
	case p == nil:
		http.Redirect(w, r, Prefix+"/login", http.StatusSeeOther)
	case p.operator:
		http.Redirect(w, r, Prefix+"/tenants", http.StatusSeeOther)
	default:
		http.Redirect(w, r, Prefix+"/t/"+p.scope.TenantID.String()+"/"+string(p.scope.Environment)+"/customers", http.StatusSeeOther)
	}
}

// signinView is the sign-in form's data.
type signinView struct {
	// Token is the double-submit CSRF token of the form (its twin is in
	// the sign-in cookie).
	Token string
	Error string
}

// loginPage shows the sign-in form.
func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.showLogin(w, r, http.StatusOK, "")
}

func (c *Console) showLogin(w http.ResponseWriter, r *http.Request, status int, msg string) {
	token := randomToken()
	setCookie(w, r, preCookie, token, 600)
	c.render(w, r, status, "login", "Sign in", signinView{Token: token, Error: msg}, 0)
}

// login signs in with the admin token or an API key, posted (never in a
// URL). The credential is not logged; a failure says only that it failed.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		c.showLogin(w, r, http.StatusBadRequest, "The form could not be read.")
		return
	}
	pre, err := r.Cookie(preCookie)
	if err != nil || pre.Value == "" || subtle.ConstantTimeCompare([]byte(pre.Value), []byte(r.PostFormValue("csrf"))) != 1 {
		c.showLogin(w, r, http.StatusForbidden, "The form has expired: try again.")
		return
	}
	if !c.signins.allowed(r.RemoteAddr) {
		c.showLogin(w, r, http.StatusTooManyRequests, "Too many failed sign-ins: wait a minute.")
		return
	}
	cred := strings.TrimSpace(r.PostFormValue("credential"))
	now := c.cfg.Clock.Now()
	ss := &session{CSRF: randomToken(), ExpiresUnix: now.Add(sessionTTL).Unix()}
	to := ""
	switch {
	case cred == "":
	case c.cfg.AdminToken != "" && subtle.ConstantTimeCompare([]byte(cred), []byte(c.cfg.AdminToken)) == 1:
		ss.Operator, to = true, Prefix+"/tenants"
	default:
		if scope, _, err := c.cfg.Tenants.Authenticate(r.Context(), cred); err == nil {
			ss.APIKey = cred
			to = Prefix + "/t/" + scope.TenantID.String() + "/" + string(scope.Environment) + "/customers"
		}
	}
	if to == "" {
		c.signins.failed(r.RemoteAddr)
		c.showLogin(w, r, http.StatusUnauthorized, "That admin token or API key is not valid.")
		return
	}
	setCookie(w, r, preCookie, "", -1)
	setCookie(w, r, sessionCookie, c.sealer.seal(sessionCookie, ss), int(sessionTTL.Seconds()))
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// logout ends the session: the browser drops its cookie, and the session
// is revoked for every node (Config.SignOuts), so a copy of the cookie
// taken before stops working too (issue 31 item 3). When the revocation
// cannot be written the user is told and stays signed in, rather than
// believing a copied cookie is dead.
func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if c.cfg.SignOuts != nil {
		ss := principalOf(r).session
		if err := c.cfg.SignOuts.SignOut(r.Context(), ss.CSRF, time.Unix(ss.ExpiresUnix, 0)); err != nil {
			c.cfg.Log.Error().Err(err).Msg("console: sign-out could not be recorded")
			c.fail(w, r, http.StatusServiceUnavailable, "Signing out failed for a moment: try again.")
			return
		}
	}
	setCookie(w, r, sessionCookie, "", -1)
	http.Redirect(w, r, Prefix+"/login", http.StatusSeeOther)
}
