package simulator

import (
	"net/http"
	"strings"
	"testing"
)

// TestRequestIDIsEchoed: a vLLM model answers with the request's X-Request-Id, as vLLM does with
// --enable-request-id-headers; an SGLang model does not echo it.
func TestRequestIDIsEchoed(t *testing.T) {
	for _, tc := range []struct {
		sw   Software
		want string
	}{{VLLM, "req-1"}, {SGLang, ""}} {
		t.Run(string(tc.sw), func(t *testing.T) {
			_, srv := newTestServer(t, tc.sw)
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"`+qwen+`","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Request-Id", "req-1")
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := resp.Header.Get("X-Request-Id"); resp.StatusCode != 200 || got != tc.want {
				t.Errorf("%d, X-Request-Id %q; want 200, %q", resp.StatusCode, got, tc.want)
			}
		})
	}
}
