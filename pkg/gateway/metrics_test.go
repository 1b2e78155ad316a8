package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

// checkEMF checks one line against the Embedded Metric Format specification: a JSON object with
// _aws.Timestamp (ms) and CloudWatchMetrics; every dimension a string member of the line, every
// metric a number member; at most 30 dimensions per set and 100 metrics per directive. It returns
// the line.
func checkEMF(t *testing.T, line []byte) map[string]any {
	t.Helper()
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("not a JSON object: %s", line)
	}
	var meta struct {
		Timestamp         *int64 `json:"Timestamp"`
		CloudWatchMetrics []struct {
			Namespace  string     `json:"Namespace"`
			Dimensions [][]string `json:"Dimensions"`
			Metrics    []struct{ Name, Unit string }
		} `json:"CloudWatchMetrics"`
	}
	raw, _ := json.Marshal(m["_aws"])
	if err := json.Unmarshal(raw, &meta); err != nil || meta.Timestamp == nil || len(meta.CloudWatchMetrics) != 1 {
		t.Fatalf("_aws %s: want Timestamp and one directive", raw)
	}
	d := meta.CloudWatchMetrics[0]
	if d.Namespace == "" || len(d.Metrics) == 0 || len(d.Metrics) > 100 {
		t.Errorf("directive %+v", d)
	}
	for _, set := range d.Dimensions {
		if len(set) > 30 {
			t.Errorf("%d dimensions in a set", len(set))
		}
		for _, dim := range set {
			if s, ok := m[dim].(string); !ok || s == "" {
				t.Errorf("dimension %s: %v, want a non-empty string member", dim, m[dim])
			}
			if dim == "org_id" || strings.Contains(strings.ToLower(dim), "org") {
				t.Errorf("the organization is a dimension: its number would explode the metrics")
			}
		}
	}
	for _, metric := range d.Metrics {
		if _, ok := m[metric.Name].(json.Number); !ok {
			t.Errorf("metric %s: %v, want a number member", metric.Name, m[metric.Name])
		}
	}
	return m
}

func TestMetricsLines(t *testing.T) {
	var buf bytes.Buffer
	m := NewMetrics(&buf, "Kiln/test")
	now := time.Date(2026, 11, 29, 17, 20, 0, 0, time.UTC)
	ok := usage.Event{GenerationID: "gen-1", OrgID: "org_a", Model: "gpt-oss-120b", Backend: "b1", Status: usage.StatusCompleted,
		HTTPStatus: 200, PromptTokens: 9, CompletionTokens: 12, Cost: money.Amount(1_155_000), TTFTMillis: 84, DurationMillis: 412}
	failed := usage.Event{GenerationID: "gen-2", OrgID: "org_a", Model: "gpt-oss-120b", Backend: "b1", Status: usage.StatusUpstreamError, HTTPStatus: 502}
	rejected := usage.Event{GenerationID: "gen-3", OrgID: "org_b", Status: usage.StatusRejected, HTTPStatus: 400}
	m.Request(ok, now)
	m.Request(failed, now)
	m.Request(rejected, now)
	m.Refused(fmt.Errorf("admit: %w", store.ErrSlotsFull), "org_a", now)
	m.Refused(store.ErrInsufficientCredits, "org_b", now)
	m.Refused(store.ErrSuspended, "org_c", now) // not counted
	var nil_ *Metrics
	nil_.Request(ok, now) // a gateway without metrics
	lines := bytes.Split(bytes.TrimSuffix(buf.Bytes(), []byte("\n")), []byte("\n"))
	if len(lines) != 5 {
		t.Fatalf("%d lines, want 5:\n%s", len(lines), buf.String())
	}
	got := make([]map[string]any, len(lines))
	for i, l := range lines {
		got[i] = checkEMF(t, l)
	}
	for _, c := range []struct {
		line        int
		member, val string
	}{
		{0, "StatusClass", "2xx"}, {0, "TimeToFirstByte", "84"}, {0, "CostUSD", "0.000001155"}, {0, "BackendErrors", "0"}, {0, "org_id", "org_a"},
		{1, "StatusClass", "5xx"}, {1, "BackendErrors", "1"}, {1, "TimeToFirstByte", "<nil>"},
		{2, "StatusClass", "4xx"}, {2, "Model", "none"}, {2, "Backend", "none"},
		{3, "RateLimited", "1"}, {3, "org_id", "org_a"},
		{4, "InsufficientCredits", "1"},
	} {
		if v := fmt.Sprint(got[c.line][c.member]); v != c.val {
			t.Errorf("line %d: %s = %s, want %s", c.line, c.member, v, c.val)
		}
	}
	if ts := fmt.Sprint(got[0]["_aws"].(map[string]any)["Timestamp"]); ts != fmt.Sprint(now.UnixMilli()) {
		t.Errorf("Timestamp %s, want %d", ts, now.UnixMilli())
	}
}

// TestMetricsFromTheGateway: with Options.Metrics, every settled request writes its line and a
// request refused for its organization's credits writes an InsufficientCredits line.
func TestMetricsFromTheGateway(t *testing.T) {
	var buf syncBuffer
	h := newHarness(t, config{gateway: func(o *Options) { o.Metrics = NewMetrics(&buf, "Kiln/test") }})
	if r := h.chat(chatBody("qwen3-32b", "hello", `"max_tokens":3`)); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	broke, _ := h.newOrg("org_broke", "0", 8)
	if r := h.do(req{path: "/v1/chat/completions", key: broke, body: chatBody("qwen3-32b", "hello", `"max_tokens":3`)}); r.status != 402 {
		t.Fatalf("an organization without credits: status %d, want 402", r.status)
	}
	h.waitIdle(h.orgID)
	var requests, limitedLines int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		requests, limitedLines = 0, 0
		for _, l := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
			if len(l) == 0 {
				continue
			}
			m := checkEMF(t, l)
			if m["Requests"] != nil {
				requests++
			}
			if m["InsufficientCredits"] != nil {
				limitedLines++
			}
		}
		if requests == 1 && limitedLines == 1 {
			return
		}
	}
	t.Errorf("%d request lines and %d InsufficientCredits lines, want 1 and 1:\n%s", requests, limitedLines, buf.Bytes())
}
