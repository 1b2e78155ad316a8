package gateway

import "testing"

// TestWorstCase pins the reservation bound of docs/api.md ("Reservations") to its worked examples.
func TestWorstCase(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name string
		ep   *endpoint
		body string
		want string
	}{
		{"gpt-oss max_tokens 500", chatEndpoint, chatBody("gpt-oss-120b", "hi", `"max_tokens":500`), "0.00460502"},
		{"gpt-oss without max_tokens", chatEndpoint, chatBody("gpt-oss-120b", "hi"), "0.00917504"},
		{"max_completion_tokens wins on chat", chatEndpoint, chatBody("gpt-oss-120b", "hi", `"max_tokens":9000`, `"max_completion_tokens":500`), "0.00460502"},
		{"max_tokens above the context", chatEndpoint, chatBody("gpt-oss-120b", "hi", `"max_tokens":900000`), "0.00917504"},
		{"qwen max_tokens 800", chatEndpoint, chatBody("qwen3-32b", "hi", `"max_tokens":800`), "0.0026016"},
		// n = 4 sequences of at most 500 tokens share one prompt: 130572 × 0.035 + 2000 × 0.07.
		{"n = 4", chatEndpoint, chatBody("gpt-oss-120b", "hi", `"max_tokens":500`, `"n":4`), "0.00471002"},
		// Three prompts, each its own sequence.
		{"prompt array", completionsEndpoint, `{"model":"gpt-oss-120b","prompt":["a","b","c"],"max_tokens":500}`, "0.01381506"},
		{"token ids are one prompt", completionsEndpoint, `{"model":"gpt-oss-120b","prompt":[1,2,3],"max_tokens":500}`, "0.00460502"},
		{"best_of above n", completionsEndpoint, `{"model":"gpt-oss-120b","prompt":"a","max_tokens":500,"n":1,"best_of":4}`, "0.00471002"},
		// k × m overflows int64: a bound beyond any amount, which no balance covers.
		{"n beyond any amount", chatEndpoint, chatBody("gpt-oss-120b", "hi", `"n":9223372036854775807`), maxReservation.String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _, e := h.gw.check(tc.ep, []byte(tc.body))
			if e != nil {
				t.Fatalf("check: %v", e.body.Message)
			}
			if got := worstCase(tc.ep, &req).String(); got != tc.want {
				t.Errorf("worst case %s, want %s", got, tc.want)
			}
		})
	}
}
