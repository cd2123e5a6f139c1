package main

import "testing"

// TestServerLatencyReadsEitherLabelOrder: creditd's histogram is read for
// one route and method whichever order the exposition writes the labels in
// (client_golang sorts them: method, route), and a longer route or another
// method is not mixed in.
func TestServerLatencyReadsEitherLabelOrder(t *testing.T) {
	for _, tc := range []struct{ name, labels string }{
		{"method first", `method="GET",route="/v1/entitlements/check"`},
		{"route first", `route="/v1/entitlements/check",method="GET"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			after := map[string]float64{
				`creditd_http_request_duration_seconds_bucket{` + tc.labels + `,le="0.00025"}`:               50,
				`creditd_http_request_duration_seconds_bucket{` + tc.labels + `,le="0.001"}`:                 99,
				`creditd_http_request_duration_seconds_bucket{` + tc.labels + `,le="+Inf"}`:                  100,
				`creditd_http_request_duration_seconds_count{` + tc.labels + `}`:                             100,
				`creditd_http_request_duration_seconds_count{method="POST",route="/v1/entitlements/check"}`:  7,
				`creditd_http_request_duration_seconds_count{method="GET",route="/v1/entitlements/check/x"}`: 9,
			}
			sl := serverLatency(map[string]float64{}, after, "GET", "/v1/entitlements/check")
			if sl == nil || sl.Requests != 100 || sl.ShareUnder1ms != 0.99 || sl.P99UpperMS != 1 || sl.P50UpperMS != 0.25 {
				t.Fatalf("server latency = %+v", sl)
			}
		})
	}
}
