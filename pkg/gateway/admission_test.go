package gateway

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/apikey"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
)

// TestOrderOfChecks walks the contract's section 2 row by row. Each request is also wrong in
// every way a later step would catch, so that the row's answer proves its precedence.
func TestOrderOfChecks(t *testing.T) {
	t.Parallel()
	h := newHarness(t, config{gateway: func(o *Options) { o.MaxBody = 4096 }})
	ctx := context.Background()

	suspendedKey, _ := h.newOrg("org_suspended", "10", 8)
	if err := h.store.SetOrgStatus(ctx, "org_suspended", store.OrgSuspended); err != nil {
		t.Fatal(err)
	}
	// A suspended organization with no credits: 403 comes before 402.
	suspendedBrokeKey, _ := h.newOrg("org_suspended_broke", "0", 8)
	if err := h.store.SetOrgStatus(ctx, "org_suspended_broke", store.OrgSuspended); err != nil {
		t.Fatal(err)
	}
	brokeKey, _ := h.newOrg("org_broke", "0", 8)
	negativeKey, _ := h.newOrg("org_negative", "1", 8)
	if err := h.store.AddEntry(ctx, store.LedgerEntry{ID: "adj_negative", OrgID: "org_negative", Kind: store.EntryAdjustment, Amount: -2 * money.Dollar, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	revokedKey, revokedID := h.newKey(h.orgID)
	if err := h.store.RevokeKey(ctx, revokedID, time.Now()); err != nil {
		t.Fatal(err)
	}
	unknownKey, _, _, err := apikey.New()
	if err != nil {
		t.Fatal(err)
	}

	big := `{"model":"qwen3-32b","messages":[{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`
	invalidBody := `{"model":"not-a-model","messages":[]}`
	// Bodies of exactly the limit and one byte over it.
	atLimit := `{"model":"not-a-model","pad":"` + strings.Repeat("p", 4096-32) + `"}`
	overLimit := atLimit + " "
	if len(atLimit) != 4096 {
		t.Fatalf("atLimit is %d bytes", len(atLimit))
	}

	tests := []struct {
		name     string
		rq       req
		status   int
		errType  string
		code     string
		hasGenID bool
	}{
		{name: "413 with Content-Length beats 401", rq: req{body: big}, status: 413, errType: "invalid_request_error", code: "request_too_large"},
		{name: "413 chunked beats 401", rq: req{body: big, chunked: true}, status: 413, errType: "invalid_request_error", code: "request_too_large"},
		{name: "413 with a valid key", rq: req{body: big, key: h.key}, status: 413, errType: "invalid_request_error", code: "request_too_large"},
		{name: "body at the limit passes step 2", rq: req{body: atLimit}, status: 401, errType: "authentication_error", code: "invalid_api_key"},
		{name: "body at the limit, chunked", rq: req{body: atLimit, chunked: true}, status: 401, errType: "authentication_error", code: "invalid_api_key"},
		{name: "one byte over the limit", rq: req{body: overLimit}, status: 413, errType: "invalid_request_error", code: "request_too_large"},
		{name: "one byte over the limit, chunked", rq: req{body: overLimit, chunked: true}, status: 413, errType: "invalid_request_error", code: "request_too_large"},
		{name: "at the limit with a key reaches step 7", rq: req{body: atLimit, key: h.key}, status: 404, errType: "invalid_request_error", code: "model_not_found", hasGenID: true},
		{name: "401 missing key", rq: req{body: invalidBody}, status: 401, errType: "authentication_error", code: "invalid_api_key"},
		{name: "401 not bearer", rq: req{body: invalidBody, header: http.Header{"Authorization": {"Basic " + h.key}}}, status: 401, errType: "authentication_error", code: "invalid_api_key"},
		{name: "401 bearer without key", rq: req{body: invalidBody, header: http.Header{"Authorization": {"Bearer"}}}, status: 401, errType: "authentication_error", code: "invalid_api_key"},
		{name: "401 malformed key", rq: req{body: invalidBody, key: "sk-not-a-kiln-key"}, status: 401, errType: "authentication_error", code: "invalid_api_key"},
		{name: "401 unknown key", rq: req{body: invalidBody, key: unknownKey}, status: 401, errType: "authentication_error", code: "invalid_api_key"},
		{name: "401 revoked key", rq: req{body: invalidBody, key: revokedKey}, status: 401, errType: "authentication_error", code: "invalid_api_key"},
		{name: "401 two Authorization headers", rq: req{body: invalidBody, header: http.Header{"Authorization": {"Bearer " + h.key, "Bearer " + h.key}}}, status: 401, errType: "authentication_error", code: "invalid_api_key"},
		{name: "401 key in the query", rq: req{path: "/v1/chat/completions?api_key=" + h.key, body: invalidBody}, status: 401, errType: "authentication_error", code: "invalid_api_key"},
		{name: "401 key in another header", rq: req{body: invalidBody, header: http.Header{"X-Api-Key": {h.key}}}, status: 401, errType: "authentication_error", code: "invalid_api_key"},
		{name: "403 suspended", rq: req{body: invalidBody, key: suspendedKey}, status: 403, errType: "permission_error", code: "organization_suspended"},
		{name: "403 beats 402", rq: req{body: invalidBody, key: suspendedBrokeKey}, status: 403, errType: "permission_error", code: "organization_suspended"},
		{name: "402 zero balance", rq: req{body: invalidBody, key: brokeKey}, status: 402, errType: "billing_error", code: "insufficient_credits"},
		{name: "402 negative balance", rq: req{body: invalidBody, key: negativeKey}, status: 402, errType: "billing_error", code: "insufficient_credits"},
		{name: "404 after admission", rq: req{body: invalidBody, key: h.key}, status: 404, errType: "invalid_request_error", code: "model_not_found", hasGenID: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.rq.path == "" {
				tc.rq.path = "/v1/chat/completions"
			}
			before := h.rec.count()
			r := h.do(tc.rq)
			if r.status != tc.status {
				t.Fatalf("status = %d, want %d; body %s", r.status, tc.status, r.body)
			}
			e := r.errorBody(t)
			if e.Type != tc.errType || deref(e.Code) != tc.code {
				t.Errorf("type, code = %s, %s; want %s, %s", e.Type, deref(e.Code), tc.errType, tc.code)
			}
			if got := r.genID() != ""; got != tc.hasGenID {
				t.Errorf("generation id present = %v, want %v (%q)", got, tc.hasGenID, r.genID())
			}
			if r.header.Get("Retry-After") != "" {
				t.Errorf("Retry-After %q outside maintenance", r.header.Get("Retry-After"))
			}
			if h.rec.count() != before {
				t.Errorf("the request reached the backend")
			}
		})
	}
}

// TestMaintenance checks that maintenance beats every other answer, on every endpoint but
// /healthz, with Retry-After as the window's end in HTTP-date form.
func TestMaintenance(t *testing.T) {
	t.Parallel()
	h := newHarness(t, config{gateway: func(o *Options) { o.MaxBody = 1024 }})
	ctx := context.Background()
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	if err := h.store.SetMaintenance(ctx, store.Maintenance{On: true, Until: until}); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 4096)
	tests := []struct {
		name string
		rq   req
	}{
		{"chat without key, too large", req{path: "/v1/chat/completions", body: big}},
		{"chat too large, chunked", req{path: "/v1/chat/completions", body: big, chunked: true}},
		{"chat with a valid request", req{path: "/v1/chat/completions", body: chatBody("qwen3-32b", "hi"), key: h.key}},
		{"completions", req{path: "/v1/completions", body: `{"model":"qwen3-32b","prompt":"hi"}`, key: h.key}},
		{"models without key", req{method: http.MethodGet, path: "/v1/models"}},
		{"credits", req{method: http.MethodGet, path: "/v1/credits", key: h.key}},
		{"generation", req{method: http.MethodGet, path: "/v1/generation?id=x", key: h.key}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do(tc.rq)
			if r.status != http.StatusServiceUnavailable {
				t.Fatalf("status = %d, want 503; body %s", r.status, r.body)
			}
			e := r.errorBody(t)
			if e.Type != "service_unavailable" || deref(e.Code) != "maintenance" {
				t.Errorf("type, code = %s, %s", e.Type, deref(e.Code))
			}
			ra := r.header.Get("Retry-After")
			at, err := http.ParseTime(ra)
			if err != nil || !at.Equal(until) || ra != until.Format(http.TimeFormat) {
				t.Errorf("Retry-After = %q, want %q", ra, until.Format(http.TimeFormat))
			}
		})
	}
	if n := h.rec.count(); n != 0 {
		t.Errorf("%d requests reached the backend during maintenance", n)
	}
	if r := h.do(req{method: http.MethodGet, path: "/healthz"}); r.status != 200 {
		t.Errorf("/healthz during maintenance: %d", r.status)
	}

	// A window that has ended, or maintenance off, lets requests through again.
	if err := h.store.SetMaintenance(ctx, store.Maintenance{On: true, Until: time.Now().Add(-time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if r := h.chat(chatBody("qwen3-32b", "hi [[sim:tokens=1]]")); r.status != 200 {
		t.Errorf("after the window: %d %s", r.status, r.body)
	}
	if err := h.store.SetMaintenance(ctx, store.Maintenance{}); err != nil {
		t.Fatal(err)
	}
	if r := h.chat(chatBody("qwen3-32b", "hi [[sim:tokens=1]]")); r.status != 200 {
		t.Errorf("maintenance off: %d %s", r.status, r.body)
	}
}

// TestInFlightLimit holds an organization's whole limit open with slow streams: the next
// request is refused with 429 and no rate-limit headers, GETs still answer, and once the streams
// end the limit is free again.
func TestInFlightLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const limit = 3
	key, _ := h.newOrg("org_limited", "10", limit)

	slow := chatBody("qwen3-32b", "hold [[sim:delay_ms=100]]", `"max_tokens":100`, `"stream":true`)
	var open []*sse
	for i := range limit {
		s := h.stream(req{path: "/v1/chat/completions", body: slow, key: key})
		if s.resp.StatusCode != 200 {
			t.Fatalf("stream %d: status %d", i, s.resp.StatusCode)
		}
		open = append(open, s)
	}

	r := h.do(req{path: "/v1/chat/completions", body: `{"model":"not-a-model"}`, key: key})
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("request over the limit: status %d, body %s", r.status, r.body)
	}
	e := r.errorBody(t)
	if e.Type != "rate_limit_error" || deref(e.Code) != "rate_limit_exceeded" {
		t.Errorf("type, code = %s, %s", e.Type, deref(e.Code))
	}
	for name := range r.header {
		l := strings.ToLower(name)
		if strings.Contains(l, "ratelimit") || strings.Contains(l, "rate-limit") || l == "retry-after" {
			t.Errorf("rate-limit header %s: %q", name, r.header.Get(name))
		}
	}
	// A refused admission has no usage event, so its answer names none (contract §5).
	if r.genID() != "" {
		t.Errorf("429 generation id %q", r.genID())
	}
	// Another organization is not affected.
	if r := h.chat(chatBody("qwen3-32b", "hi [[sim:tokens=1]]")); r.status != 200 {
		t.Errorf("other organization: %d %s", r.status, r.body)
	}
	// GETs stop after step 4: no slot needed.
	for _, path := range []string{"/v1/models", "/v1/credits", "/v1/models/qwen3-32b"} {
		if r := h.do(req{method: http.MethodGet, path: path, key: key}); r.status != 200 {
			t.Errorf("GET %s at the limit: %d %s", path, r.status, r.body)
		}
	}

	for _, s := range open {
		s.close()
	}
	h.waitIdle("org_limited")
	short := chatBody("qwen3-32b", "again [[sim:tokens=1]]")
	for i := range limit + 1 {
		h.waitIdle("org_limited") // a slot is released a moment after the client read the end
		if r := h.do(req{path: "/v1/chat/completions", body: short, key: key}); r.status != 200 {
			t.Errorf("request %d after the streams ended: %d %s", i, r.status, r.body)
		}
	}
}

// TestGETsStopAfterAuthentication checks that a broke organization can still read its
// credits and the catalog, and that a suspended one cannot.
func TestGETsStopAfterAuthentication(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	brokeKey, _ := h.newOrg("org_broke", "0", 8)
	suspendedKey, _ := h.newOrg("org_suspended", "5", 8)
	if err := h.store.SetOrgStatus(context.Background(), "org_suspended", store.OrgSuspended); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/models", "/v1/models/gpt-oss-120b", "/v1/credits", "/v1/generation?id=gen-x"} {
		t.Run(path, func(t *testing.T) {
			r := h.do(req{method: http.MethodGet, path: path, key: brokeKey})
			if r.status == 402 || r.status == 401 || r.status == 403 {
				t.Errorf("broke organization: %d %s", r.status, r.body)
			}
			r = h.do(req{method: http.MethodGet, path: path, key: suspendedKey})
			if r.status != 403 || deref(r.errorBody(t).Code) != "organization_suspended" {
				t.Errorf("suspended organization: %d %s", r.status, r.body)
			}
			r = h.do(req{method: http.MethodGet, path: path})
			if r.status != 401 || deref(r.errorBody(t).Code) != "invalid_api_key" {
				t.Errorf("no key: %d %s", r.status, r.body)
			}
			if r.genID() != "" {
				t.Errorf("GET carries a generation id")
			}
		})
	}
}
