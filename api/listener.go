package api

import (
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// Door limits (invariant 11).
const (
	// DefaultMaxConnsPerIP is the per-client connection cap when Config
	// leaves it 0: far above what one well-behaved client keeps open (a
	// pool of a few hundred), far below what exhausts file descriptors.
	DefaultMaxConnsPerIP = 1024
	// ipv6ClientBits is how much of an IPv6 address names one client: a
	// host owns a whole /64, so counting single addresses would cap nothing.
	ipv6ClientBits = 64
	// lingerTime and lingerBytes bound how long and how much a refused
	// connection is drained before it closes (see doorConn.Close).
	lingerTime  = 2 * time.Second
	lingerBytes = 16 << 20
	// refuseWriteTimeout bounds writing the 429 to a connection over the
	// per-client cap, so a stalled peer cannot stall Accept.
	refuseWriteTimeout = 100 * time.Millisecond
)

// tooManyConns is the whole answer to a connection over the per-client cap,
// written before any request is read (so there is no request id).
var tooManyConns = func() []byte {
	body := `{"type":"rate-limited","title":"Rate Limited","status":429,"detail":"too many open connections from this client; reuse or close some","request_id":""}`
	return []byte("HTTP/1.1 429 Too Many Requests\r\n" +
		"Content-Type: application/problem+json\r\n" +
		"Retry-After: 1\r\n" +
		"Connection: close\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

// doorListener wraps the listening socket: it caps open connections per
// client (an IPv4 address or an IPv6 /64; fasthttp's own MaxConnsPerIP counts
// IPv4 only) and hands out doorConns, which drain a refused request before
// closing.
type doorListener struct {
	net.Listener
	maxPerClient int
	log          zerolog.Logger
	// lastWarn is when a refusal was last logged (unix ns): at most one a
	// minute, so a flood of connections cannot flood the log.
	lastWarn atomic.Int64

	mu   sync.Mutex
	open map[netip.Addr]int
}

func newDoorListener(ln net.Listener, maxPerClient int, log zerolog.Logger) *doorListener {
	return &doorListener{Listener: ln, maxPerClient: maxPerClient, log: log, open: map[netip.Addr]int{}}
}

// Accept returns the next connection within its client's cap; one over the
// cap gets a 429 and is closed here.
func (l *doorListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		client, ok := clientOf(c.RemoteAddr())
		if !ok {
			return &doorConn{Conn: c}, nil
		}
		if l.enter(client) {
			return &doorConn{Conn: c, door: l, client: client, counted: true}, nil
		}
		_ = c.SetWriteDeadline(time.Now().Add(refuseWriteTimeout))
		_, _ = c.Write(tooManyConns)
		_ = c.Close()
		if now, last := time.Now().UnixNano(), l.lastWarn.Load(); now-last > int64(time.Minute) && l.lastWarn.CompareAndSwap(last, now) {
			l.log.Warn().Str("client", client.String()).Int("max_conns_per_ip", l.maxPerClient).Msg("connection refused: client over its connection cap (logged at most once a minute)")
		}
	}
}

// enter counts one more connection of client, or refuses it at the cap.
func (l *doorListener) enter(client netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.open[client]
	if n >= l.maxPerClient {
		return false
	}
	l.open[client] = n + 1
	return true
}

// leave uncounts a closed connection; a client with none left is dropped,
// so the map holds only clients with open connections.
func (l *doorListener) leave(client netip.Addr) {
	l.mu.Lock()
	if n := l.open[client] - 1; n > 0 {
		l.open[client] = n
	} else {
		delete(l.open, client)
	}
	l.mu.Unlock()
}

// clientOf is the counting key of a remote address: the IPv4 address, or
// the /64 of an IPv6 one. Other addresses (in-memory test pipes) are not
// counted.
func clientOf(addr net.Addr) (netip.Addr, bool) {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return netip.Addr{}, false
	}
	ip, ok := netip.AddrFromSlice(tcp.IP)
	if !ok {
		return netip.Addr{}, false
	}
	ip = ip.Unmap()
	if ip.Is4() {
		return ip, true
	}
	p, err := ip.Prefix(ipv6ClientBits)
	if err != nil {
		return netip.Addr{}, false
	}
	return p.Addr(), true
}

// doorConn is one accepted connection. When the server refused a request
// whose body it did not read (413, or 401 before a large body), closing at
// once would leave that body unread in the kernel, which answers the client
// with a reset that can destroy the refusal before the client reads it; so
// such a connection closes gracefully: the write side first, then the body
// is drained into nothing, at most lingerBytes for lingerTime.
type doorConn struct {
	net.Conn
	door    *doorListener
	client  netip.Addr
	counted bool
	linger  atomic.Bool
	closed  atomic.Bool
}

// lingerOnClose asks Close to drain the peer's unread data first.
func (c *doorConn) lingerOnClose() { c.linger.Store(true) }

// Close closes the connection once (fasthttp may close an idle connection
// from another goroutine) and uncounts it.
func (c *doorConn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	if c.linger.Load() {
		c.drain()
	}
	err := c.Conn.Close()
	if c.counted {
		c.door.leave(c.client)
	}
	return err
}

// drain half-closes the connection and reads what the peer still sends,
// keeping none of it.
func (c *doorConn) drain() {
	if hc, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		_ = hc.CloseWrite()
	}
	if err := c.Conn.SetReadDeadline(time.Now().Add(lingerTime)); err != nil {
		return
	}
	_, _ = io.CopyN(io.Discard, c.Conn, lingerBytes)
}
