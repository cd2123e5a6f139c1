package main

import (
	"bytes"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// rtProxy is a TCP proxy that counts round trips between creditd and one
// server (issue 26: "round trips before a money call answers"). A round
// trip is a client send that follows an answer (or opens the connection):
// a pipeline, a MULTI/EXEC block or Postgres's Parse/Bind/Execute/Sync are
// one round trip, as they are one wait for the network, however many
// commands they carry. Counting at the wire needs no MONITOR and no server
// extension, and commands a script runs inside Redis are not round trips,
// which INFO commandstats cannot tell apart.
type rtProxy struct {
	ln       net.Listener
	upstream string
	// postgres: the wire is Postgres's (else Redis's RESP), for naming
	// what each trip sent.
	postgres bool
	trips    atomic.Int64
	// record, when set, keeps each trip's description by its number.
	record atomic.Bool
	hmu    sync.Mutex
	heads  map[int64]string
	// stmts maps a prepared statement's name to its text, from the Parse
	// messages seen (pgx prepares once per connection, then only Binds).
	stmts map[string]string
	// reservationBlocking, when > 0, delays the answer to every blocking stream
	// read (the persister's XREADGROUP BLOCK, lua/outbox.go) by that many
	// nanoseconds: the persister then wakes after the request that woke
	// it has been answered, so its round trips fall outside that
	// request's window instead of racing into it.
	reservationBlocking atomic.Int64
	wg                  sync.WaitGroup
	mu                  sync.Mutex
	conns               map[net.Conn]bool
}

// startRTProxy listens on a free loopback port and forwards every
// connection to upstream.
func startRTProxy(upstream string, postgres bool) (*rtProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &rtProxy{ln: ln, upstream: upstream, postgres: postgres, conns: map[net.Conn]bool{},
		heads: map[int64]string{}, stmts: map[string]string{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *rtProxy) Addr() string { return p.ln.Addr().String() }

// Trips is the round trips counted so far, over every connection.
func (p *rtProxy) Trips() int64 { return p.trips.Load() }

// Heads is the descriptions of the recorded trips numbered in [from, to).
func (p *rtProxy) Heads(from, to int64) []string {
	p.hmu.Lock()
	defer p.hmu.Unlock()
	var out []string
	for i := from; i < to; i++ {
		if h, ok := p.heads[i]; ok {
			out = append(out, h)
		}
	}
	return out
}

// sent notes one client read: a new trip when it follows an answer.
func (p *rtProxy) sent(b []byte, newTrip bool) {
	var head string
	if p.postgres {
		p.hmu.Lock()
		head = pgHead(b, p.stmts)
		p.hmu.Unlock()
	} else if p.record.Load() {
		head = redisHead(b)
	}
	if !newTrip {
		return
	}
	if !p.record.Load() {
		p.trips.Add(1)
		return
	}
	p.hmu.Lock()
	p.heads[p.trips.Add(1)-1] = head
	p.hmu.Unlock()
}

// Close stops accepting and cuts every proxied connection.
func (p *rtProxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *rtProxy) track(c net.Conn, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
}

func (p *rtProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.serve(c)
		}()
	}
}

// serve pipes one connection both ways; the turn flag says whose turn it
// was last, so only a client send after an answer starts a new trip.
func (p *rtProxy) serve(c net.Conn) {
	defer c.Close()
	up, err := net.Dial("tcp", p.upstream)
	if err != nil {
		return
	}
	defer up.Close()
	p.track(c, true)
	p.track(up, true)
	defer p.track(c, false)
	defer p.track(up, false)
	var answered, reservation atomic.Bool
	answered.Store(true)
	done := make(chan struct{}, 2)
	go func() {
		pipe(up, c, func(b []byte) {
			p.sent(b, answered.Swap(false))
			if p.reservationBlocking.Load() > 0 && isBlockingRead(b) {
				reservation.Store(true)
			}
		})
		done <- struct{}{}
	}()
	go func() {
		pipe(c, up, func([]byte) {
			if d := p.reservationBlocking.Load(); reservation.Swap(false) && d > 0 {
				time.Sleep(time.Duration(d))
			}
			answered.Store(true)
		})
		done <- struct{}{}
	}()
	<-done
	_ = c.Close()
	_ = up.Close()
	<-done
}

// pipe copies src to dst, calling seen with each read before forwarding
// it.
func pipe(dst, src net.Conn, seen func([]byte)) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			seen(buf[:n])
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// redisHead names a RESP send by its first command: an FCALL by its
// function, an EVALSHA or FCALL by the shape of its first key (ids masked,
// so the key says what the script is for), a MULTI by the command after
// it; "+N" counts the further commands of a pipeline.
func redisHead(b []byte) string {
	name, rest, ok := firstRESPWord(b)
	if !ok {
		return "?"
	}
	out := string(bytes.ToUpper(name))
	switch out {
	case "FCALL", "FCALL_RO", "EVALSHA":
		fn, rest, ok := firstBulk(rest)
		if !ok {
			break
		}
		if out != "EVALSHA" {
			out += " " + string(fn)
		}
		if nk, rest, ok := firstBulk(rest); ok && string(nk) != "0" {
			if key, _, ok := firstBulk(rest); ok {
				out += " " + keyShape(string(key))
			}
		}
	case "MULTI":
		if next, _, ok := firstRESPWord(bytes.TrimPrefix(rest, []byte("\r\n"))); ok {
			out += " " + string(bytes.ToUpper(next))
		}
	}
	if n := bytes.Count(b, []byte("\r\n*")); n > 0 {
		out += " +" + strconv.Itoa(n)
	}
	return out
}

// keyShape is key with every run of 4 or more hex digits or dashes (ids,
// uuids, hashes), and every run of decimal digits (partition numbers),
// shown as "*".
func keyShape(key string) string {
	var out strings.Builder
	run := 0
	flush := func(s string) {
		if run >= 4 || strings.Trim(s, "0123456789") == "" {
			out.WriteByte('*')
		} else {
			out.WriteString(s)
		}
		run = 0
	}
	start := 0
	for i := 0; i <= len(key); i++ {
		if i < len(key) && isIDByte(key[i]) {
			if run == 0 {
				start = i
			}
			run++
			continue
		}
		if run > 0 {
			flush(key[start:i])
		}
		if i < len(key) {
			out.WriteByte(key[i])
		}
	}
	return out.String()
}

func isIDByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' || c == '-'
}

// firstBulk is the bulk string at the start of b ("$len\r\ndata\r\n").
func firstBulk(b []byte) (word, rest []byte, ok bool) {
	b = bytes.TrimPrefix(b, []byte("\r\n"))
	if len(b) == 0 || b[0] != '$' {
		return nil, nil, false
	}
	j := bytes.Index(b, []byte("\r\n"))
	if j < 0 {
		return nil, nil, false
	}
	n, err := strconv.Atoi(string(b[1:j]))
	if err != nil || n < 0 || j+2+n > len(b) {
		return nil, nil, false
	}
	return b[j+2 : j+2+n], b[j+2+n:], true
}

// pgHead names a Postgres send by the statements it carries (simple
// Query, or Parse/Bind of the extended protocol, a Bind named through
// stmts), noting every Parse's text in stmts; "?" when it carries none
// (a startup packet, a bare Sync).
func pgHead(b []byte, stmts map[string]string) string {
	var names []string
	for len(b) >= 5 {
		typ := b[0]
		n := int(int32(uint32(b[1])<<24 | uint32(b[2])<<16 | uint32(b[3])<<8 | uint32(b[4])))
		if n < 4 || 1+n > len(b) {
			break
		}
		body := b[5 : 1+n]
		b = b[1+n:]
		cstr := func(x []byte) (string, []byte) {
			i := bytes.IndexByte(x, 0)
			if i < 0 {
				return string(x), nil
			}
			return string(x[:i]), x[i+1:]
		}
		switch typ {
		case 'Q':
			q, _ := cstr(body)
			names = append(names, statementGist(q))
		case 'P':
			name, rest := cstr(body)
			q, _ := cstr(rest)
			if name != "" {
				stmts[name] = q
			}
			names = append(names, statementGist(q))
		case 'B':
			_, rest := cstr(body)
			stmt, _ := cstr(rest)
			if q, ok := stmts[stmt]; ok {
				names = append(names, statementGist(q))
			} else if stmt == "" {
				continue // the unnamed statement, Parsed in this same send
			} else {
				names = append(names, "statement "+stmt)
			}
		}
	}
	if len(names) == 0 {
		return "?"
	}
	// A Parse and the Bind of the same statement in one send name it once.
	out := names[:1]
	for _, n := range names[1:] {
		if n != out[len(out)-1] {
			out = append(out, n)
		}
	}
	return strings.Join(out, " + ")
}

// isBlockingRead says whether a client send to Redis starts with a stream
// read that blocks (XREADGROUP or XREAD with BLOCK), from its RESP array
// header and first bulk string.
func isBlockingRead(b []byte) bool {
	name, rest, ok := firstRESPWord(b)
	if !ok {
		return false
	}
	name = bytes.ToUpper(name)
	if !bytes.Equal(name, []byte("XREADGROUP")) && !bytes.Equal(name, []byte("XREAD")) {
		return false
	}
	return bytes.Contains(bytes.ToUpper(rest[:min(len(rest), 256)]), []byte("\r\nBLOCK\r\n"))
}

// firstRESPWord is the first bulk string of a RESP array and what follows
// it.
func firstRESPWord(b []byte) (word, rest []byte, ok bool) {
	if len(b) == 0 || b[0] != '*' {
		return nil, nil, false
	}
	i := bytes.Index(b, []byte("\r\n"))
	if i < 0 || i+2 >= len(b) || b[i+2] != '$' {
		return nil, nil, false
	}
	b = b[i+3:]
	j := bytes.Index(b, []byte("\r\n"))
	if j < 0 {
		return nil, nil, false
	}
	n, err := strconv.Atoi(string(b[:j]))
	if err != nil || n < 0 || j+2+n > len(b) {
		return nil, nil, false
	}
	return b[j+2 : j+2+n], b[j+2+n:], true
}
