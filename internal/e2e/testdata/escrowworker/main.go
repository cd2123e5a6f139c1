// Command escrowworker is one evaluator process of the e2e escrow test
// (issue 27 item 2): it consumes units of a metric for a customer through
// edge.Evaluator.Consume at a fixed pace, prints its EscrowStats as a JSON
// line every report interval, and on SIGTERM stops, closes the evaluator
// (settling what it used) and prints a last line with "final": true.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/creditd/creditd/client"
	"github.com/creditd/creditd/client/edge"
)

// line is what the worker prints.
type line struct {
	edge.EscrowStats
	Final bool `json:"final"`
	// Calls and ConsumeNs measure the Consume calls answered locally.
	Calls     int64 `json:"calls"`
	ConsumeNs int64 `json:"consume_ns"`
	Errors    int64 `json:"errors"`
}

func main() {
	url := flag.String("url", "", "creditd base URL")
	key := flag.String("key", "", "tenant API key")
	customer := flag.String("customer", "", "customer id")
	metric := flag.String("metric", "", "billable metric key")
	name := flag.String("name", "", "process name, written as metadata.process")
	perTick := flag.Int("units-per-ms", 10, "units consumed each millisecond (one unit a call)")
	settle := flag.Duration("settle", 100*time.Millisecond, "settle interval")
	ttl := flag.Duration("ttl", 2*time.Second, "reservation lifetime")
	report := flag.Duration("report", 10*time.Millisecond, "stats line interval")
	flag.Parse()

	ev := edge.New(client.New(*url, *key), edge.Config{Escrow: edge.EscrowConfig{
		SettleInterval: *settle, ReservationTTL: *ttl, MaxUnits: 5_000, MaxWait: 3 * time.Second,
		Metadata: map[string]any{"process": *name},
	}})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	var mu sync.Mutex
	var out line
	emit := func() {
		mu.Lock()
		l := out
		mu.Unlock()
		l.EscrowStats = ev.Stats()
		raw, _ := json.Marshal(l)
		fmt.Println(string(raw))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for range *perTick {
				start := time.Now()
				c, err := ev.Consume(ctx, *customer, *metric, 1)
				d := time.Since(start)
				mu.Lock()
				switch {
				case err == nil && c.Local:
					out.Calls++
					out.ConsumeNs += d.Nanoseconds()
				case err != nil && !client.IsProblem(err, client.ProblemInsufficientCredits) && ctx.Err() == nil:
					out.Errors++
					fmt.Fprintln(os.Stderr, "consume:", err)
				}
				mu.Unlock()
			}
		}
	}()
	t := time.NewTicker(*report)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			emit()
		case <-ctx.Done():
			<-done
			ev.Close()
			mu.Lock()
			out.Final = true
			mu.Unlock()
			emit()
			return
		}
	}
}
