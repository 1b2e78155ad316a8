package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/neocloud/kiln/pkg/usage"
)

type modelEntry struct {
	ID                string   `json:"id"`
	Object            string   `json:"object"`
	Created           int64    `json:"created"`
	OwnedBy           string   `json:"owned_by"`
	ContextLength     int      `json:"context_length"`
	InputModalities   []string `json:"input_modalities"`
	ParallelToolCalls *bool    `json:"parallel_tool_calls"`
	ForcedToolChoice  *bool    `json:"forced_tool_choice"`
	Pricing           struct {
		Input       json.RawMessage `json:"input"`
		CachedInput json.RawMessage `json:"cached_input"`
		Output      json.RawMessage `json:"output"`
	} `json:"pricing"`
}

var wantModels = []struct {
	id                    string
	contextLength         int
	parallel, forced      bool
	input, cached, output string
}{
	{"qwen3-32b", 40960, false, false, `"0.06"`, `"0.03"`, `"0.24"`},
	{"gpt-oss-120b", 131072, true, true, `"0.035"`, `"0.0175"`, `"0.07"`},
}

func checkModel(t *testing.T, got modelEntry, i int) {
	t.Helper()
	w := wantModels[i]
	if got.ID != w.id || got.Object != "model" || got.Created != 1754000000 || got.OwnedBy != "neocloud" ||
		got.ContextLength != w.contextLength || len(got.InputModalities) != 1 || got.InputModalities[0] != "text" ||
		got.ParallelToolCalls == nil || *got.ParallelToolCalls != w.parallel || got.ForcedToolChoice == nil || *got.ForcedToolChoice != w.forced {
		t.Errorf("model %d: %+v", i, got)
	}
	if string(got.Pricing.Input) != w.input || string(got.Pricing.CachedInput) != w.cached || string(got.Pricing.Output) != w.output {
		t.Errorf("model %s pricing %s %s %s, want %s %s %s", w.id, got.Pricing.Input, got.Pricing.CachedInput, got.Pricing.Output, w.input, w.cached, w.output)
	}
}

func decodeStrict(t *testing.T, body []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
}

// TestModels checks /v1/models and /v1/models/{id}.
func TestModels(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.do(req{method: http.MethodGet, path: "/v1/models", key: h.key})
	if r.status != 200 || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("%d %q %s", r.status, r.header.Get("Content-Type"), r.body)
	}
	var list struct {
		Object string       `json:"object"`
		Data   []modelEntry `json:"data"`
	}
	decodeStrict(t, r.body, &list)
	if list.Object != "list" || len(list.Data) != len(wantModels) {
		t.Fatalf("list %s", r.body)
	}
	for i, m := range list.Data {
		checkModel(t, m, i)
	}

	for i, w := range wantModels {
		t.Run(w.id, func(t *testing.T) {
			r := h.do(req{method: http.MethodGet, path: "/v1/models/" + w.id, key: h.key})
			if r.status != 200 || r.header.Get("Content-Type") != "application/json" {
				t.Fatalf("%d %s", r.status, r.body)
			}
			var m modelEntry
			decodeStrict(t, r.body, &m)
			checkModel(t, m, i)
		})
	}
	for _, id := range []string{"not-a-model", "Qwen/Qwen3-32B", ""} {
		t.Run("404 "+id, func(t *testing.T) {
			r := h.do(req{method: http.MethodGet, path: "/v1/models/" + id, key: h.key})
			if r.status != 404 {
				t.Fatalf("%d %s", r.status, r.body)
			}
			e := r.errorBody(t)
			if deref(e.Code) != "model_not_found" || deref(e.Param) != "model" || e.Type != "invalid_request_error" ||
				e.Message != "The model `"+id+"` does not exist or you do not have access to it." {
				t.Errorf("%+v", e)
			}
		})
	}
	if r := h.do(req{method: http.MethodHead, path: "/v1/models", key: h.key}); r.status != 200 || len(r.body) != 0 {
		t.Errorf("HEAD: %d, %d bytes", r.status, len(r.body))
	}
}

// TestCredits checks /v1/credits: the caller's balance as a decimal string and its limit.
func TestCredits(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	otherKey, _ := h.newOrg("org_other", "0.000001155", 3)
	tests := []struct {
		key, org, balance string
		limit             int
	}{
		{h.key, h.orgID, initialCredits, 8},
		{otherKey, "org_other", "0.000001155", 3},
	}
	for _, tc := range tests {
		t.Run(tc.org, func(t *testing.T) {
			r := h.do(req{method: http.MethodGet, path: "/v1/credits", key: tc.key})
			if r.status != 200 || r.header.Get("Content-Type") != "application/json" {
				t.Fatalf("%d %s", r.status, r.body)
			}
			var c struct {
				Object      string          `json:"object"`
				OrgID       string          `json:"org_id"`
				Balance     json.RawMessage `json:"balance"`
				Reserved    json.RawMessage `json:"reserved"`
				Available   json.RawMessage `json:"available"`
				Currency    string          `json:"currency"`
				MaxInFlight int             `json:"max_in_flight"`
				InFlight    int             `json:"in_flight"`
			}
			decodeStrict(t, r.body, &c)
			if c.Object != "credits" || c.OrgID != tc.org || string(c.Balance) != `"`+tc.balance+`"` || string(c.Reserved) != `"0"` ||
				string(c.Available) != `"`+tc.balance+`"` || c.Currency != "USD" || c.MaxInFlight != tc.limit || c.InFlight != 0 {
				t.Errorf("%s", r.body)
			}
		})
	}
}

// TestGeneration checks /v1/generation: one's own event, 404 for another organization's id.
func TestGeneration(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	otherKey, _ := h.newOrg("org_other", "1", 8)
	r := h.chat(`{"model":"gpt-oss-120b","messages":[{"role":"system","content":"Answer briefly."},{"role":"user","content":"gen two three four five six seven"}],"max_tokens":12}`)
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	id := r.genID()
	h.waitEvent(h.orgID, id)

	t.Run("own", func(t *testing.T) {
		r := h.do(req{method: http.MethodGet, path: "/v1/generation?id=" + id, key: h.key})
		if r.status != 200 || r.header.Get("Content-Type") != "application/json" {
			t.Fatalf("%d %s", r.status, r.body)
		}
		var g struct {
			Object string `json:"object"`
			usage.Event
		}
		decodeStrict(t, r.body, &g)
		if g.Object != "generation" || g.GenerationID != id || g.OrgID != h.orgID || g.KeyID != h.keyID || g.Model != "gpt-oss-120b" ||
			g.Endpoint != "/v1/chat/completions" || g.Status != "completed" || g.HTTPStatus != 200 || g.PromptTokens != 9 ||
			g.CompletionTokens != 12 || g.Cost.String() != "0.000001155" || g.Backend != "gpt-oss-120b-sim-1" || g.StartedAt.IsZero() {
			t.Errorf("%s", r.body)
		}
		if !bytes.Contains(r.body, []byte(`"cost":"0.000001155"`)) {
			t.Errorf("cost is not a decimal string: %s", r.body)
		}
		if bytes.Contains(r.body, []byte(h.key)) {
			t.Errorf("the key is in the event")
		}
	})
	tests := []struct {
		name, path, key string
		status          int
		code, param     string
	}{
		{"another organization's id", "/v1/generation?id=" + id, otherKey, 404, "generation_not_found", ""},
		{"unknown id", "/v1/generation?id=gen-01ARZ3NDEKTSV4RRFFQ69G5FAV", h.key, 404, "generation_not_found", ""},
		{"missing id", "/v1/generation", h.key, 400, "missing_required_parameter", "id"},
		{"empty id", "/v1/generation?id=", h.key, 400, "missing_required_parameter", "id"},
		{"not a generation id", "/v1/generation?id=x%00" + strings.Repeat("9", 3000), h.key, 404, "generation_not_found", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do(req{method: http.MethodGet, path: tc.path, key: tc.key})
			if r.status != tc.status {
				t.Fatalf("%d %s", r.status, r.body)
			}
			e := r.errorBody(t)
			if deref(e.Code) != tc.code || (tc.param != "" && deref(e.Param) != tc.param) || e.Type != "invalid_request_error" {
				t.Errorf("%+v", e)
			}
		})
	}
}

// TestHealthz checks that /healthz answers without a key and without touching the store.
func TestHealthz(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	// A gateway whose store is closed: any store access would fail.
	closed := newHarness(t)
	closed.store.Close()
	for name, url := range map[string]string{"open": h.srv.URL, "closed store": closed.srv.URL} {
		t.Run(name, func(t *testing.T) {
			for _, method := range []string{http.MethodGet, http.MethodHead} {
				rq, _ := http.NewRequest(method, url+"/healthz", nil)
				resp, err := http.DefaultClient.Do(rq)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Errorf("%s /healthz: %d", method, resp.StatusCode)
				}
			}
		})
	}
	// The handler alone, with no store at all behind it.
	g := &Gateway{}
	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if rec.Code != 200 || rec.Body.String() != "{\"status\":\"ok\"}\n" {
		t.Errorf("%d %q", rec.Code, rec.Body.String())
	}
}

// TestGenerationFinishReasonNull: an event without a finish reason shows null, not "", and the
// object's name comes first.
func TestGenerationFinishReasonNull(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.do(req{path: "/v1/chat/completions", body: `{"model":"not-a-model","messages":[{"role":"user","content":"hi"}]}`, key: h.key})
	if r.status != 404 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	h.waitEvent(h.orgID, r.genID())
	g := h.do(req{method: http.MethodGet, path: "/v1/generation?id=" + r.genID(), key: h.key})
	if g.status != 200 || !bytes.HasPrefix(g.body, []byte(`{"object":"generation","version":1,`)) ||
		!bytes.Contains(g.body, []byte(`"finish_reason":null`)) || bytes.Count(g.body, []byte(`"finish_reason"`)) != 1 {
		t.Errorf("%d %s", g.status, g.body)
	}
}
