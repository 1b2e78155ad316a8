package upstream

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/neocloud/kiln/pkg/catalog"
)

// rotating is a TokenSource whose token the test changes, as a rotation of the secret does;
// Refused moves it to the next token, as a re-read of the secret would.
type rotating struct {
	mu      sync.Mutex
	tokens  []string
	refused int
}

func (r *rotating) Token() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tokens[0]
}

func (r *rotating) Refused() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refused++
	if len(r.tokens) > 1 {
		r.tokens = r.tokens[1:]
	}
}

// TestBackendTokenReadAtRunTime: a backend whose api_key_env has a token source gets the
// source's current token on every request, over both connection kinds; a 401 tells the source,
// whose next token the next request carries; a token with a line break is never sent.
func TestBackendTokenReadAtRunTime(t *testing.T) {
	var mu sync.Mutex
	want := "new-token"
	var seen []string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, r.Header.Get("Authorization"))
		if r.Header.Get("Authorization") != "Bearer "+want {
			w.WriteHeader(http.StatusUnauthorized)
		}
	})
	for _, tc := range []struct {
		name string
		srv  *httptest.Server
	}{{"http", httptest.NewServer(h)}, {"https", httptest.NewTLSServer(h)}} {
		t.Run(tc.name, func(t *testing.T) {
			defer tc.srv.Close()
			seen = nil
			src := &rotating{tokens: []string{"old-token", "new-token"}}
			c := model(catalog.Backend{Name: "b", URL: tc.srv.URL + "/v1", APIKeyEnv: "KILN_BACKEND_API_KEY"})
			p := New(c, Options{
				Tokens: map[string]TokenSource{"KILN_BACKEND_API_KEY": src},
				Getenv: func(string) string { return "from-the-environment" },
			})
			if tc.srv.TLS != nil {
				p.backends["b"].transport.TLSClientConfig = tc.srv.Client().Transport.(*http.Transport).TLSClientConfig
			}
			var statuses []int
			for range 2 {
				resp, err := p.Do(context.Background(), Call{Model: c.Models[0], Path: "/x", Body: body, OrgID: "org-a"})
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				statuses = append(statuses, resp.StatusCode)
			}
			if statuses[0] != http.StatusUnauthorized || statuses[1] != http.StatusOK || src.refused != 1 {
				t.Errorf("statuses %v, refused %d: want the old token refused once, then the new one accepted", statuses, src.refused)
			}
			if len(seen) != 2 || seen[0] != "Bearer old-token" || seen[1] != "Bearer new-token" {
				t.Errorf("Authorization headers %q", seen)
			}
			src.tokens = []string{"bad\r\nX-Injected: 1"}
			resp, err := p.Do(context.Background(), Call{Model: c.Models[0], Path: "/x", Body: body, OrgID: "org-a"})
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := seen[len(seen)-1]; got != "" {
				t.Errorf("a token with a line break was sent: %q", got)
			}
		})
	}
}
