package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// readyPollEvery is how often each /readyz is polled during a fault: the
// balancer checks every second (deploy/haproxy.cfg `inter 1s fall 2`), so
// four polls a second see every answer it could act on.
const readyPollEvery = 250 * time.Millisecond

// ReadyPoll is what one /readyz answered while a fault lasted.
type ReadyPoll struct {
	Target string `json:"target"` // "node 2 127.0.0.1:PORT" or "haproxy URL"
	Polls  int    `json:"polls"`
	OK     int    `json:"ok_200"`
	// Not200 counts the other answers by status (or "no answer").
	Not200 map[string]int `json:"not_200,omitempty"`
	// LongestOutS is the longest stretch of non-200 answers, from the
	// first poll of the stretch to the first 200 after it.
	LongestOutS float64 `json:"longest_not_200_s"`
}

// Stayed: every poll answered 200.
func (p ReadyPoll) Stayed() bool { return p.Polls > 0 && p.OK == p.Polls }

func (p ReadyPoll) String() string {
	s := fmt.Sprintf("%s: %d/%d polls 200", p.Target, p.OK, p.Polls)
	if len(p.Not200) > 0 {
		var ks []string
		for k, n := range p.Not200 {
			ks = append(ks, fmt.Sprintf("%s x%d", k, n))
		}
		sort.Strings(ks)
		s += fmt.Sprintf(" (%s; longest %.1f s)", strings.Join(ks, ", "), p.LongestOutS)
	}
	return s
}

// readyPoller polls each live node's own /readyz and HAProxy's until stop.
type readyPoller struct {
	stopC chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	polls []ReadyPoll
}

// pollReady starts polling every node of f but down (1-based; 0: none is
// down) and the balancer.
func pollReady(ctx context.Context, f *Fleet, down int) *readyPoller {
	p := &readyPoller{stopC: make(chan struct{})}
	hc := &http.Client{Timeout: 3 * time.Second}
	targets := map[string]string{"haproxy " + f.URL: f.URL + "/readyz"}
	for i, n := range f.Nodes {
		if i+1 != down {
			targets["node "+strconv.Itoa(i+1)+" "+n] = "http://" + n + "/readyz"
		}
	}
	for name, u := range targets {
		p.wg.Add(1)
		go func(name, u string) {
			defer p.wg.Done()
			rp := ReadyPoll{Target: name, Not200: map[string]int{}}
			var outSince time.Time
			for {
				at := time.Now()
				what := "no answer"
				req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
				if res, err := hc.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					what = strconv.Itoa(res.StatusCode)
					if res.StatusCode != 200 && res.Header.Get("Proxy-Status") != "" {
						what += " from HAProxy"
					}
				}
				rp.Polls++
				if what == "200" {
					rp.OK++
					if !outSince.IsZero() {
						rp.LongestOutS = max(rp.LongestOutS, at.Sub(outSince).Seconds())
						outSince = time.Time{}
					}
				} else {
					rp.Not200[what]++
					if outSince.IsZero() {
						outSince = at
					}
				}
				select {
				case <-p.stopC:
				case <-ctx.Done():
				case <-time.After(time.Until(at.Add(readyPollEvery))):
					continue
				}
				if !outSince.IsZero() {
					rp.LongestOutS = max(rp.LongestOutS, time.Since(outSince).Seconds())
				}
				p.mu.Lock()
				p.polls = append(p.polls, rp)
				p.mu.Unlock()
				return
			}
		}(name, u)
	}
	return p
}

// stop ends the polls and returns them, the balancer first, then the
// nodes in order.
func (p *readyPoller) stop() []ReadyPoll {
	close(p.stopC)
	p.wg.Wait()
	sort.Slice(p.polls, func(i, j int) bool {
		hi, hj := strings.HasPrefix(p.polls[i].Target, "haproxy"), strings.HasPrefix(p.polls[j].Target, "haproxy")
		if hi != hj {
			return hi
		}
		return p.polls[i].Target < p.polls[j].Target
	})
	return p.polls
}

// allStayed: every target answered 200 to every poll.
func allStayed(polls []ReadyPoll) bool {
	if len(polls) == 0 {
		return false
	}
	for _, p := range polls {
		if !p.Stayed() {
			return false
		}
	}
	return true
}
