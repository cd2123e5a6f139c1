// Package sender posts signed webhook bodies over net/http for the engine's
// delivery workers (engine.Sender).
package sender

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/creditd/creditd/engine"
)

// HTTP is an engine.Sender on a net/http client with the spec's 5 s
// per-attempt timeout, no redirects (a redirect is not a 2xx), bounded
// connection reuse, and an address check on every connect.
type HTTP struct {
	client       *http.Client
	allowPrivate bool
	dialer       *net.Dialer
	// resolve looks a host name up (net.DefaultResolver; tests swap it to
	// make a name resolve where they want, as a rebinding DNS server would).
	resolve func(ctx context.Context, host string) ([]netip.Addr, error)
}

var _ engine.Sender = (*HTTP)(nil)

// New returns a sender whose attempts each end after timeout
// (engine.DeliveryTimeout when 0). Unless allowPrivate
// (CREDITD_WEBHOOK_ALLOW_PRIVATE), it refuses to connect to any address in
// engine.SpecialPurposeRanges, judged on the address it is about to dial,
// so DNS that changes after the URL was set (rebinding) gains nothing.
func New(timeout time.Duration, allowPrivate bool) *HTTP {
	if timeout <= 0 {
		timeout = engine.DeliveryTimeout
	}
	s := &HTTP{
		allowPrivate: allowPrivate,
		resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		},
	}
	s.dialer = &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second, Control: s.control}
	tr := &http.Transport{
		// No proxy: the address check must see the destination, and a proxy
		// would connect on our behalf to wherever the URL points.
		Proxy:                 nil,
		DialContext:           s.dial,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
	}
	s.client = &http.Client{
		Transport: tr,
		Timeout:   timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	return s
}

// Send posts body to url with headers; it reads at most
// engine.MaxStoredResponseBytes of the answer. A transport failure comes
// back with its category (engine.DeliveryFailure) beside the raw error.
func (s *HTTP) Send(ctx context.Context, url string, headers map[string]string, body []byte) engine.SendResult {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return engine.SendResult{Err: err, Failure: engine.FailureOther}
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("User-Agent", "creditd-webhooks/1")
	res, err := s.client.Do(req)
	if err != nil {
		return engine.SendResult{Err: err, Failure: FailureOf(err)}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, engine.MaxStoredResponseBytes))
	// Drain a little more so the connection can be reused; never all of it.
	_, _ = io.CopyN(io.Discard, res.Body, 64<<10)
	if err != nil && isTimeout(err) {
		return engine.SendResult{StatusCode: res.StatusCode, Body: b, Err: err, Failure: engine.FailureTimeout}
	}
	return engine.SendResult{StatusCode: res.StatusCode, Body: b}
}

// BlockedError is a connect refused because the address is special-purpose.
type BlockedError struct {
	Addr  netip.Addr
	Range engine.SpecialRange
}

// Error names the address and range, for the operator's log only.
func (e *BlockedError) Error() string {
	return fmt.Sprintf("sender: %s is in %s (%s); not connecting", e.Addr, e.Range.Prefix, e.Range.Name)
}

// check refuses a special-purpose address unless private ones are allowed.
func (s *HTTP) check(a netip.Addr) error {
	if s.allowPrivate {
		return nil
	}
	if r, special := engine.SpecialPurpose(a); special {
		return &BlockedError{Addr: a, Range: r}
	}
	return nil
}

// dial resolves the host itself, checks every address it resolved to, and
// connects to a checked address (never the name again, which a rebinding DNS
// server could answer differently). One special-purpose answer refuses the
// host: a name that mixes public and private addresses is not trusted.
func (s *HTTP) dial(ctx context.Context, network, address string) (net.Conn, error) {
	host, portText, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("sender: bad port %q", portText)
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else if addrs, err = s.resolve(ctx, host); err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return nil, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
	}
	for _, a := range addrs {
		if err := s.check(a); err != nil {
			return nil, err
		}
	}
	var first error
	for _, a := range addrs {
		c, err := s.dialer.DialContext(ctx, network, netip.AddrPortFrom(a.Unmap(), uint16(port)).String())
		if err == nil {
			return c, nil
		}
		if first == nil {
			first = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, first
}

// control checks the address the socket is about to connect to, the last
// moment before a packet leaves: whatever path produced the address, a
// special-purpose one is never reached.
func (s *HTTP) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		if s.allowPrivate {
			return nil
		}
		return fmt.Errorf("sender: cannot check address %q: %w", address, err)
	}
	return s.check(ap.Addr())
}

// FailureOf is the category of a transport error: what a tenant may see
// instead of its text.
func FailureOf(err error) engine.DeliveryFailure {
	var blocked *BlockedError
	var dns *net.DNSError
	switch {
	case errors.As(err, &blocked):
		return engine.FailureBlocked
	case errors.As(err, &dns):
		return engine.FailureDNS
	case isTimeout(err):
		return engine.FailureTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return engine.FailureRefused
	case errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH):
		return engine.FailureUnreachable
	case isTLS(err):
		return engine.FailureTLS
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return engine.FailureReset
	}
	return engine.FailureOther
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// isTLS reports a handshake or certificate failure (an https URL on a plain
// HTTP port included). Remote alerts have an
// unexported type, so the "tls: " prefix crypto/tls gives every error it
// makes is the fallback.
func isTLS(err error) bool {
	var (
		rec     tls.RecordHeaderError
		verify  *tls.CertificateVerificationError
		alert   tls.AlertError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		invalid x509.CertificateInvalidError
	)
	if errors.Is(err, http.ErrSchemeMismatch) || errors.As(err, &rec) || errors.As(err, &verify) || errors.As(err, &alert) ||
		errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid) {
		return true
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		if strings.HasPrefix(e.Error(), "tls: ") {
			return true
		}
	}
	return false
}
