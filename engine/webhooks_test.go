package engine

import "testing"

// TestSignVector checks Sign against the Standard Webhooks specification's
// published example (docs/spec/addendum.md §9).
func TestSignVector(t *testing.T) {
	got, err := Sign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, []byte(`{"test": 2432232314}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	if _, err := Sign("whsec_not base64!", "id", 1, nil); err == nil {
		t.Fatal("a secret that is not base64 signs")
	}
}

// TestRetrySchedule pins the delays before attempts 2..7 (docs/spec/interface.md Delivery 3).
func TestRetrySchedule(t *testing.T) {
	want := []string{"30s", "5m0s", "30m0s", "2h0m0s", "8h0m0s", "24h0m0s"}
	for i, d := range RetryDelays {
		if d.String() != want[i] {
			t.Fatalf("delay before attempt %d = %s, want %s", i+2, d, want[i])
		}
	}
}
