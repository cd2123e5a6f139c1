// Package sender posts signed webhook bodies over net/http for the engine's
// delivery workers (engine.Sender).
package sender

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/creditd/creditd/engine"
)

// HTTP is an engine.Sender on a net/http client with the spec's 5 s
// per-attempt timeout, no redirects (a redirect is not a 2xx), and bounded
// connection reuse.
type HTTP struct {
	client *http.Client
}

var _ engine.Sender = (*HTTP)(nil)

// New returns a sender whose attempts each end after timeout (engine.DeliveryTimeout when 0).
func New(timeout time.Duration) *HTTP {
	if timeout <= 0 {
		timeout = engine.DeliveryTimeout
	}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
	}
	return &HTTP{client: &http.Client{
		Transport: tr,
		Timeout:   timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}}
}

// Send posts body to url with headers; it reads at most
// engine.MaxStoredResponseBytes of the answer.
func (s *HTTP) Send(ctx context.Context, url string, headers map[string]string, body []byte) engine.SendResult {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return engine.SendResult{Err: err}
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("User-Agent", "creditd-webhooks/1")
	res, err := s.client.Do(req)
	if err != nil {
		return engine.SendResult{Err: err, Timeout: isTimeout(err)}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, engine.MaxStoredResponseBytes))
	// Drain a little more so the connection can be reused; never all of it.
	_, _ = io.CopyN(io.Discard, res.Body, 64<<10)
	if err != nil && isTimeout(err) {
		return engine.SendResult{StatusCode: res.StatusCode, Body: b, Err: err, Timeout: true}
	}
	return engine.SendResult{StatusCode: res.StatusCode, Body: b}
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
