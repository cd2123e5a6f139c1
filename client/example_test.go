package client_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/creditd/creditd/client"
)

// The README's quickstart; compiled by go test, not run (it needs a creditd).
func Example() {
	c := client.New("http://localhost:8080", os.Getenv("CREDITD_API_KEY"))
	ctx := context.Background()
	_, err := c.GrantCredits(ctx, "alice", client.GrantInput{Credits: 10_000, Source: "promotional", Reason: "welcome"})
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := c.Consume(ctx, client.ConsumeInput{CustomerID: "alice", BillableMetricKey: "api_call", Units: 3})
	switch {
	case client.IsProblem(err, client.ProblemInsufficientCredits): // refuse the request
	case err != nil: // *client.Problem (type, status, detail, field, request_id) or a transport error
	default:
		fmt.Println("charged", res.Charged, "left", res.BalanceAfter)
	}
}

// A webhook receiver that verifies creditd's signature before it trusts a
// delivery.
func ExampleWebhookVerifier() {
	v, err := client.NewWebhookVerifier(os.Getenv("CREDITD_WEBHOOK_SECRET"))
	if err != nil {
		fmt.Println(err)
		return
	}
	http.HandleFunc("/hooks", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20)) // verify the raw body, before decoding
		ev, err := v.Parse(r.Header, body)
		if err != nil {
			http.Error(w, "bad signature", http.StatusBadRequest)
			return
		}
		fmt.Println(ev.EventID, ev.EventType) // dedupe on EventID: delivery is at least once
	})
}
