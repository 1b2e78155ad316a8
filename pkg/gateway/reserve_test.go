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
		// Counts are read as the backend's pydantic reads an int: 4.0, 4e0 and "4" are 4.
		{"n as a float", chatEndpoint, chatBody("gpt-oss-120b", "hi", `"max_tokens":500`, `"n":4.0`), "0.00471002"},
		{"n with an exponent", chatEndpoint, chatBody("gpt-oss-120b", "hi", `"max_tokens":500`, `"n":4e0`), "0.00471002"},
		{"n and max_tokens as strings", chatEndpoint, chatBody("gpt-oss-120b", "hi", `"max_tokens":"500"`, `"n":" 4"`), "0.00471002"},
		{"best_of as a string", completionsEndpoint, `{"model":"gpt-oss-120b","prompt":"a","max_tokens":500,"best_of":"4"}`, "0.00471002"},
		{"n with a fraction reserves the next count", chatEndpoint, chatBody("gpt-oss-120b", "hi", `"max_tokens":500`, `"n":4.5`), "0.00474502"},
		{"n as a string beyond a float's units", chatEndpoint, chatBody("gpt-oss-120b", "hi", `"n":"9007199254740993.0"`), maxReservation.String()},
		{"n not a count", chatEndpoint, chatBody("gpt-oss-120b", "hi", `"max_tokens":500`, `"n":"four"`), "0.00460502"},
		{"n beyond int64", chatEndpoint, chatBody("gpt-oss-120b", "hi", `"n":99999999999999999999`), maxReservation.String()},
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
