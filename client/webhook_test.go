package client_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/creditd/creditd/client"
)

// The Standard Webhooks specification's published example, also the
// vector creditd's signer is tested with.
const (
	vectorSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorID     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vectorTS     = 1614265330
	vectorBody   = `{"test": 2432232314}`
	vectorSig    = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func vectorHeader(sig, ts string) http.Header {
	h := http.Header{}
	h.Set("webhook-id", vectorID)
	h.Set("webhook-timestamp", ts)
	h.Set("webhook-signature", sig)
	return h
}

// TestWebhookVerifyVector checks the verifier and SignWebhook against the
// specification's vector, and that each tampering is refused with its
// error.
func TestWebhookVerifyVector(t *testing.T) {
	t.Parallel()
	sig, err := client.SignWebhook(vectorSecret, vectorID, time.Unix(vectorTS, 0), []byte(vectorBody))
	if err != nil || sig != vectorSig {
		t.Fatalf("SignWebhook = %q, %v; want %q", sig, err, vectorSig)
	}
	v, err := client.NewWebhookVerifier(vectorSecret)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Unix(vectorTS, 0).Add(time.Minute)
	other, _ := client.SignWebhook("whsec_"+"c2VjcmV0LW9mLWFub3RoZXItdGVuYW50", vectorID, time.Unix(vectorTS, 0), []byte(vectorBody))
	for _, tc := range []struct {
		name   string
		header http.Header
		body   string
		now    time.Time
		want   error
	}{
		{"valid", vectorHeader(vectorSig, "1614265330"), vectorBody, at, nil},
		{"one of several signatures", vectorHeader(other+" "+vectorSig, "1614265330"), vectorBody, at, nil},
		{"tampered body", vectorHeader(vectorSig, "1614265330"), `{"test": 2432232315}`, at, client.ErrWebhookSignature},
		{"other secret", vectorHeader(other, "1614265330"), vectorBody, at, client.ErrWebhookSignature},
		{"moved timestamp", vectorHeader(vectorSig, "1614265331"), vectorBody, at, client.ErrWebhookSignature},
		{"unknown version", vectorHeader("v2,"+vectorSig[3:], "1614265330"), vectorBody, at, client.ErrWebhookSignature},
		{"too old", vectorHeader(vectorSig, "1614265330"), vectorBody, time.Unix(vectorTS, 0).Add(6 * time.Minute), client.ErrWebhookTimestamp},
		{"from the future", vectorHeader(vectorSig, "1614265330"), vectorBody, time.Unix(vectorTS, 0).Add(-6 * time.Minute), client.ErrWebhookTimestamp},
		{"no signature", vectorHeader("", "1614265330"), vectorBody, at, client.ErrWebhookHeaders},
		{"bad timestamp", vectorHeader(vectorSig, "soon"), vectorBody, at, client.ErrWebhookHeaders},
	} {
		if err := v.VerifyAt(tc.header, []byte(tc.body), tc.now); !errors.Is(err, tc.want) {
			t.Errorf("%s: VerifyAt = %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := client.NewWebhookVerifier("whsec_not base64!"); err == nil {
		t.Fatal("a secret that is not base64 was accepted")
	}
}
