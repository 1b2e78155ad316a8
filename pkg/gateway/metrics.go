package gateway

import (
	"cmp"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

// Metrics writes the operator's metrics as CloudWatch Embedded Metric Format lines: one JSON
// object per line with an _aws member, which CloudWatch Logs turns into metrics of Namespace
// when the line reaches a log group (on Lambda, anything the function writes). Per settled
// request: Requests, BackendErrors and SlotsLost (counts), TimeToFirstByte and Duration
// (milliseconds), PromptTokens, CompletionTokens and CostUSD, by no dimension, by StatusClass
// (2xx, 4xx, 5xx) and by Model and Backend. Per refused admission: RateLimited (429) or
// InsufficientCredits (402). The organization is never a dimension (their number would explode
// the metrics bill); it is a property of each line, for CloudWatch Logs Insights, as are a
// request's generation id, status and HTTP status: a request's metrics line is its log line too
// (Gateway.finish). CostUSD is a float for graphs; the ledger is the bill. A nil *Metrics writes
// nothing.
type Metrics struct {
	w         io.Writer
	namespace string
	requests  [2][]emfDirective // a request line's directives, without and with TimeToFirstByte
	mu        sync.Mutex        // one line per write, never interleaved
}

// NewMetrics returns Metrics writing lines of namespace to w.
func NewMetrics(w io.Writer, namespace string) *Metrics {
	dims := [][]string{{}, {"StatusClass"}, {"Model", "Backend"}}
	metrics := []emfMetric{{"Requests", "Count"}, {"BackendErrors", "Count"}, {"SlotsLost", "Count"}, {"Duration", "Milliseconds"},
		{"PromptTokens", "Count"}, {"CompletionTokens", "Count"}, {"CostUSD", "None"}, {"TimeToFirstByte", "Milliseconds"}}
	return &Metrics{w: w, namespace: namespace, requests: [2][]emfDirective{
		{{Namespace: namespace, Dimensions: dims, Metrics: metrics[:len(metrics)-1]}},
		{{Namespace: namespace, Dimensions: dims, Metrics: metrics}},
	}}
}

type emfMetric struct {
	Name string `json:"Name"`
	Unit string `json:"Unit"`
}

type emfDirective struct {
	Namespace  string      `json:"Namespace"`
	Dimensions [][]string  `json:"Dimensions"`
	Metrics    []emfMetric `json:"Metrics"`
}

type emfMeta struct {
	Timestamp         int64          `json:"Timestamp"`
	CloudWatchMetrics []emfDirective `json:"CloudWatchMetrics"`
}

// requestLine is a request's metrics line. Its members are in the order a map of them had
// (encoding/json sorts a map's keys), so that the line is the same as before it had a type.
type requestLine struct {
	Backend          string  `json:"Backend"`
	BackendErrors    int     `json:"BackendErrors"`
	CompletionTokens int64   `json:"CompletionTokens"`
	CostUSD          float64 `json:"CostUSD"`
	Duration         int64   `json:"Duration"`
	Model            string  `json:"Model"`
	PromptTokens     int64   `json:"PromptTokens"`
	Requests         int     `json:"Requests"`
	SlotsLost        int     `json:"SlotsLost"`
	StatusClass      string  `json:"StatusClass"`
	TimeToFirstByte  int64   `json:"TimeToFirstByte,omitempty"`
	AWS              emfMeta `json:"_aws"`
	GenerationID     string  `json:"generation_id"`
	HTTPStatus       int     `json:"http_status"`
	OrgID            string  `json:"org_id"`
	Status           string  `json:"status"`
}

// Request writes the metrics of one settled request, at now.
func (m *Metrics) Request(e usage.Event, now time.Time) {
	if m == nil {
		return
	}
	line := requestLine{
		Backend: cmp.Or(e.Backend, "none"), BackendErrors: boolCount(e.Status == usage.StatusUpstreamError),
		CompletionTokens: e.CompletionTokens, CostUSD: float64(e.Cost) / 1e12, Duration: e.DurationMillis,
		Model: cmp.Or(e.Model, "none"), PromptTokens: e.PromptTokens, Requests: 1,
		SlotsLost: boolCount(e.Status == usage.StatusSlotLost), StatusClass: statusClass(e.HTTPStatus),
		GenerationID: e.GenerationID, HTTPStatus: e.HTTPStatus, OrgID: e.OrgID, Status: string(e.Status),
		// Time to first byte only where a backend answered: a refused request's zero would drag
		// the percentiles down.
		TimeToFirstByte: max(e.TTFTMillis, 0),
	}
	line.AWS = emfMeta{Timestamp: now.UnixMilli(), CloudWatchMetrics: m.requests[boolCount(e.TTFTMillis > 0)]}
	m.write(&line)
}

// Refused writes the count of an admission the store refused for the in-flight limit (429) or the
// credits (402); other errors write nothing.
func (m *Metrics) Refused(err error, orgID string, now time.Time) {
	if m == nil || err == nil {
		return
	}
	var name string
	switch {
	case errors.Is(err, store.ErrSlotsFull):
		name = "RateLimited"
	case errors.Is(err, store.ErrInsufficientCredits):
		name = "InsufficientCredits"
	default:
		return
	}
	directive := emfDirective{Namespace: m.namespace, Dimensions: [][]string{{}}, Metrics: []emfMetric{{name, "Count"}}}
	m.write(map[string]any{name: 1, "org_id": orgID, "_aws": emfMeta{Timestamp: now.UnixMilli(), CloudWatchMetrics: []emfDirective{directive}}})
}

// write writes line as one JSON line, in one Write.
func (m *Metrics) write(line any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_ = json.NewEncoder(m.w).Encode(line) // every value is a string or a number: only the write can fail
}

func statusClass(status int) string {
	if status < 100 || status > 599 {
		return "other"
	}
	return strconv.Itoa(status/100) + "xx"
}

func boolCount(b bool) int {
	if b {
		return 1
	}
	return 0
}
