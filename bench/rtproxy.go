package main

import (
	"bytes"
	"net"
	"strconv"
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
	trips    atomic.Int64
	// holdBlocking, when > 0, delays the answer to every blocking stream
	// read (the persister's XREADGROUP BLOCK, lua/outbox.go) by that many
	// nanoseconds: the persister then wakes after the request that woke
	// it has been answered, so its round trips fall outside that
	// request's window instead of racing into it.
	holdBlocking atomic.Int64
	wg           sync.WaitGroup
	mu           sync.Mutex
	conns        map[net.Conn]bool
}

// startRTProxy listens on a free loopback port and forwards every
// connection to upstream.
func startRTProxy(upstream string) (*rtProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &rtProxy{ln: ln, upstream: upstream, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *rtProxy) Addr() string { return p.ln.Addr().String() }

// Trips is the round trips counted so far, over every connection.
func (p *rtProxy) Trips() int64 { return p.trips.Load() }

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
	var answered, hold atomic.Bool
	answered.Store(true)
	done := make(chan struct{}, 2)
	go func() {
		pipe(up, c, func(b []byte) {
			if answered.Swap(false) {
				p.trips.Add(1)
			}
			if p.holdBlocking.Load() > 0 && isBlockingRead(b) {
				hold.Store(true)
			}
		})
		done <- struct{}{}
	}()
	go func() {
		pipe(c, up, func([]byte) {
			if d := p.holdBlocking.Load(); hold.Swap(false) && d > 0 {
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
