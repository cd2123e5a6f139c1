package sender

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/creditd/creditd/engine"
)

// listener is a local TCP listener that counts the connections it accepts
// and serves each with handle (closing it when handle is nil).
type listener struct {
	ln       net.Listener
	accepted atomic.Int64
}

func newListener(t *testing.T, handle func(net.Conn)) *listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &listener{ln: ln}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.accepted.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				if handle != nil {
					handle(c)
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return l
}

func (l *listener) port() string {
	return strconv.Itoa(l.ln.Addr().(*net.TCPAddr).Port)
}

// withDNS makes s resolve names from table, as a (rebinding) DNS server
// would answer; unknown names do not exist.
func withDNS(s *HTTP, table map[string][]string) *HTTP {
	s.resolve = func(_ context.Context, host string) ([]netip.Addr, error) {
		answers, ok := table[host]
		if !ok {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		out := make([]netip.Addr, len(answers))
		for i, a := range answers {
			out[i] = netip.MustParseAddr(a)
		}
		return out, nil
	}
	return s
}

// TestDialTimeAddressCheck: a name that resolves to a private address when
// the sender connects (DNS rebinding: the URL passed its check when set) is
// refused in the dialer, on every attempt, without a connection being made;
// so are special-purpose literals in any spelling. Dev mode connects.
func TestDialTimeAddressCheck(t *testing.T) {
	t.Parallel()
	l := newListener(t, nil)
	dns := map[string][]string{
		"rebind.test": {"127.0.0.1"},
		"mixed.test":  {"93.184.216.34", "127.0.0.1"},
		"mapped.test": {"::ffff:127.0.0.1"},
	}
	s := withDNS(New(2*time.Second, false), dns)
	urls := []string{
		"http://rebind.test:" + l.port() + "/hook",
		"http://rebind.test:" + l.port() + "/hook", // every connect is checked, not the first only
		"http://mixed.test:" + l.port() + "/",
		"http://mapped.test:" + l.port() + "/",
		"http://127.0.0.1:" + l.port() + "/",
		"http://[::ffff:127.0.0.1]:" + l.port() + "/",
		"http://[::127.0.0.1]:" + l.port() + "/",
		"http://0.0.0.0:" + l.port() + "/",
		"https://rebind.test:" + l.port() + "/",
	}
	for _, u := range urls {
		res := s.Send(context.Background(), u, nil, []byte(`{}`))
		if res.Err == nil || res.Failure != engine.FailureBlocked || res.StatusCode != 0 {
			t.Errorf("%s: status %d failure %q err %v, want blocked_address", u, res.StatusCode, res.Failure, res.Err)
		}
	}
	if n := l.accepted.Load(); n != 0 {
		t.Fatalf("the private listener accepted %d connections", n)
	}
	// The refusal is the check, not a dead listener: dev mode connects.
	dev := withDNS(New(2*time.Second, true), dns)
	res := dev.Send(context.Background(), "http://rebind.test:"+l.port()+"/hook", nil, []byte(`{}`))
	if res.Failure == engine.FailureBlocked || l.accepted.Load() != 1 {
		t.Fatalf("dev mode: failure %q, accepted %d, want one connection", res.Failure, l.accepted.Load())
	}
	// The socket-level check refuses whatever address reaches connect.
	if err := s.control("tcp4", "10.1.2.3:443", nil); FailureOf(err) != engine.FailureBlocked {
		t.Fatalf("control on a private address: %v", err)
	}
	if err := s.control("tcp4", "93.184.216.34:443", nil); err != nil {
		t.Fatalf("control on a public address: %v", err)
	}
}

// eventStore is the engine.EventStore of one claimed event: it keeps the
// attempt the worker records.
type eventStore struct {
	mu       sync.Mutex
	attempts []engine.Attempt
}

func (s *eventStore) InsertEvent(context.Context, engine.Event) error { return nil }
func (s *eventStore) ClaimDue(context.Context, time.Time, time.Duration, int, int, []uuid.UUID) ([]engine.Claim, error) {
	return nil, nil
}
func (s *eventStore) RecordAttempt(_ context.Context, _ engine.Claim, a engine.Attempt) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attempts = append(s.attempts, a)
	return true, nil
}
func (s *eventStore) ListEvents(context.Context, uuid.UUID, engine.EventQuery) (engine.Page[engine.Event], error) {
	return engine.Page[engine.Event]{}, nil
}
func (s *eventStore) Redeliver(context.Context, uuid.UUID, uuid.UUID, time.Time) (engine.Event, error) {
	return engine.Event{}, nil
}

// tenantAt is an engine.TenantReader whose tenant's webhook URL is url.
type tenantAt struct{ url string }

func (r tenantAt) GetTenant(_ context.Context, id uuid.UUID) (engine.Tenant, error) {
	secret := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	return engine.Tenant{ID: id, WebhookURL: &r.url, WebhookSecret: &secret}, nil
}

// TestLastErrorCategories delivers to endpoints that fail in each way and
// checks that last_error and the delivery's error are the category alone:
// never an address, a port, a banner or other Go error text.
func TestLastErrorCategories(t *testing.T) {
	t.Parallel()
	status := func(code int) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			if code == http.StatusFound {
				w.Header().Set("Location", "http://169.254.169.254/latest/meta-data/")
			}
			w.WriteHeader(code)
			_, _ = w.Write([]byte("answer"))
		}
	}
	http500 := httptest.NewServer(status(500))
	t.Cleanup(http500.Close)
	redirect := httptest.NewServer(status(http.StatusFound))
	t.Cleanup(redirect.Close)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(2 * time.Second):
		}
	}))
	t.Cleanup(slow.Close)
	untrusted := httptest.NewUnstartedServer(status(200))
	untrusted.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake is expected
	untrusted.StartTLS()
	t.Cleanup(untrusted.Close)
	eof := newListener(t, func(c net.Conn) { _, _ = c.Read(make([]byte, 1024)) })
	banner := newListener(t, func(c net.Conn) {
		_, _ = c.Write([]byte("SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n"))
		_, _ = c.Read(make([]byte, 1024))
	})
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedPort := strconv.Itoa(closed.Addr().(*net.TCPAddr).Port)
	closed.Close()
	private := newListener(t, nil)

	dns := map[string][]string{"rebind.test": {"127.0.0.1"}}
	// Only the timeout case gets a short attempt timeout: a TLS handshake
	// under -race on a loaded machine can take longer than 300 ms, and the
	// other cases must fail for their own reason, not time out first.
	open := withDNS(New(5*time.Second, true), dns)
	quick := withDNS(New(300*time.Millisecond, true), dns)
	guarded := withDNS(New(5*time.Second, false), dns)
	cases := []struct {
		name   string
		sender *HTTP
		url    string
		want   string
		status int
	}{
		{"HTTP 500", open, http500.URL, "HTTP 500", 500},
		{"redirect not followed", open, redirect.URL, "HTTP 302", 302},
		{"timeout", quick, slow.URL, "timeout", 0},
		{"refused", open, "http://127.0.0.1:" + refusedPort + "/", "connection_refused", 0},
		{"closed without answer", open, "http://127.0.0.1:" + eof.port() + "/", "connection_reset", 0},
		{"not HTTP", open, "http://127.0.0.1:" + banner.port() + "/", "other", 0},
		{"untrusted certificate", open, untrusted.URL, "tls", 0},
		{"TLS to a plain HTTP port", open, strings.Replace(http500.URL, "http://", "https://", 1), "tls", 0},
		{"unknown name", open, "http://nowhere.test/", "dns", 0},
		{"private at dial time", guarded, "http://rebind.test:" + private.port() + "/", "blocked_address", 0},
	}
	leaks := []string{"127.0.0.1", "dial", "tcp", "SSH", "x509", "Post ", "lookup", "EOF", "169.254"}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			store := &eventStore{}
			wh := engine.NewWebhooks(store, tenantAt{url: c.url}, c.sender, engine.SystemClock{}, zerolog.Nop())
			ev := engine.Event{ID: uuid.New(), TenantID: uuid.New(), Payload: []byte(`{"type":"test.ping"}`)}
			wh.Deliver(context.Background(), engine.Claim{Event: ev, Lease: uuid.New()})
			if len(store.attempts) != 1 {
				t.Fatalf("%d attempts recorded", len(store.attempts))
			}
			a := store.attempts[0]
			if a.LastError == nil || *a.LastError != c.want {
				t.Fatalf("last_error = %v, want %q", deref(a.LastError), c.want)
			}
			if c.status != 0 {
				if a.StatusCode == nil || *a.StatusCode != c.status || a.Error != nil {
					t.Fatalf("status %v error %v, want %d and no error", a.StatusCode, deref(a.Error), c.status)
				}
			} else if a.Error == nil || *a.Error != c.want || a.StatusCode != nil {
				t.Fatalf("delivery error = %v status %v, want %q", deref(a.Error), a.StatusCode, c.want)
			}
			for _, s := range []string{deref(a.LastError), deref(a.Error)} {
				for _, leak := range append(leaks, strings.TrimPrefix(c.url, "http://")) {
					if strings.Contains(s, leak) {
						t.Fatalf("error %q leaks %q", s, leak)
					}
				}
			}
		})
	}
	if n := private.accepted.Load(); n != 0 {
		t.Fatalf("the private listener accepted %d connections", n)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
