package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
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

// TestRequestLogLine: a settled request is logged once, with what an operator looks for: its
// generation id, organization, model, backend, status and durations, and nothing that only
// repeats its usage record. Without metrics that is the logger's "request" line; with them, the
// metrics line, and the logger writes nothing for it.
func TestRequestLogLine(t *testing.T) {
	want := []string{"generation_id", "org_id", "status", "http_status"}
	notLogged := []string{"key_id", "cost", "prompt_tokens", "cached_tokens", "completion_tokens", "endpoint", "estimated"}
	for _, withMetrics := range []bool{false, true} {
		t.Run(fmt.Sprintf("metrics=%v", withMetrics), func(t *testing.T) {
			var logs, metrics syncBuffer
			h := newHarness(t, config{gateway: func(o *Options) {
				o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
				if withMetrics {
					o.Metrics = NewMetrics(&metrics, "Kiln/test")
				}
			}})
			r := h.chat(chatBody("qwen3-32b", "hello", `"max_tokens":3`))
			if r.status != 200 {
				t.Fatalf("status %d", r.status)
			}
			genID := r.genID()
			h.waitEvent(h.orgID, genID)
			h.waitIdle(h.orgID)
			var lines []map[string]any
			for deadline := time.Now().Add(10 * time.Second); len(lines) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				out := logs.Bytes()
				if withMetrics {
					out = metrics.Bytes()
				}
				for _, l := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
					var m map[string]any
					if json.Unmarshal(l, &m) == nil && m["generation_id"] == genID {
						lines = append(lines, m)
					}
				}
			}
			if len(lines) != 1 {
				t.Fatalf("%d lines of %s, want 1:\n%s\n%s", len(lines), genID, logs.Bytes(), metrics.Bytes())
			}
			line := lines[0]
			model, backend, ttft, duration := "model", "backend", "ttft_ms", "duration_ms"
			if withMetrics {
				checkEMF(t, metrics.Bytes()[:bytes.IndexByte(metrics.Bytes(), '\n')])
				model, backend, ttft, duration = "Model", "Backend", "TimeToFirstByte", "Duration"
				for _, l := range bytes.Split(bytes.TrimSpace(logs.Bytes()), []byte("\n")) {
					if bytes.Contains(l, []byte(genID)) {
						t.Errorf("with metrics, the logger also wrote %s", l)
					}
				}
			} else if line["msg"] != "request" || line["level"] != "INFO" {
				t.Errorf("line %v, want msg request at INFO", line)
			}
			for _, k := range append(want, model, backend, ttft, duration) {
				if v, ok := line[k]; !ok || v == "" {
					t.Errorf("%s: %v, want it in the line %v", k, v, line)
				}
			}
			if line["org_id"] != h.orgID || line["status"] != "completed" || fmt.Sprint(line["http_status"]) != "200" || line[model] != "qwen3-32b" {
				t.Errorf("line %v", line)
			}
			for _, k := range notLogged {
				if _, ok := line[k]; ok {
					t.Errorf("%s is in the line, but only repeats the usage record: %v", k, line)
				}
			}
		})
	}
}

// failingOnce fails its first write and keeps the others.
type failingOnce struct {
	failed bool
	lines  int
}

func (w *failingOnce) Write(p []byte) (int, error) {
	if !w.failed {
		w.failed = true
		return 0, errors.New("write: resource temporarily unavailable")
	}
	w.lines += bytes.Count(p, []byte("\n"))
	return len(p), nil
}

// TestMetricsOutliveAFailedWrite: a line the writer refuses is lost alone; the next are written.
func TestMetricsOutliveAFailedWrite(t *testing.T) {
	w := &failingOnce{}
	m := NewMetrics(w, "Kiln/test")
	for range 3 {
		m.Refused(store.ErrSlotsFull, "org_a", time.Now())
	}
	if w.lines != 2 {
		t.Errorf("%d lines after one failed write, want 2", w.lines)
	}
}

// BenchmarkMetricsRequest is the metrics line of one completed request, the only line a request
// writes where metrics are on (on Lambda).
func BenchmarkMetricsRequest(b *testing.B) {
	m := NewMetrics(io.Discard, "Kiln/bench")
	e := usage.Event{GenerationID: "gen-01KB7Z3Q5V0J8M2N4P6R8T0W2Y", OrgID: "org_a", Model: "gpt-oss-120b", Backend: "b1", Status: usage.StatusCompleted,
		HTTPStatus: 200, PromptTokens: 9, CompletionTokens: 12, Cost: money.Amount(1_155_000), TTFTMillis: 84, DurationMillis: 412}
	now := time.Date(2026, 11, 29, 17, 20, 0, 0, time.UTC)
	b.ReportAllocs()
	for b.Loop() {
		m.Request(e, now)
	}
}
