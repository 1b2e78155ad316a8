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
	mu        sync.Mutex // one line per write, never interleaved
}

// NewMetrics returns Metrics writing lines of namespace to w.
func NewMetrics(w io.Writer, namespace string) *Metrics {
	return &Metrics{w: w, namespace: namespace}
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

// requestDimensions are the dimension sets of a request's metrics.
var requestDimensions = [][]string{{}, {"StatusClass"}, {"Model", "Backend"}}

// Request writes the metrics of one settled request, at now.
func (m *Metrics) Request(e usage.Event, now time.Time) {
	if m == nil {
		return
	}
	line := map[string]any{
		"StatusClass":      statusClass(e.HTTPStatus),
		"Model":            cmp.Or(e.Model, "none"),
		"Backend":          cmp.Or(e.Backend, "none"),
		"Requests":         1,
		"BackendErrors":    boolCount(e.Status == usage.StatusUpstreamError),
		"SlotsLost":        boolCount(e.Status == usage.StatusSlotLost),
		"Duration":         e.DurationMillis,
		"PromptTokens":     e.PromptTokens,
		"CompletionTokens": e.CompletionTokens,
		"CostUSD":          float64(e.Cost) / 1e12,
		"generation_id":    e.GenerationID,
		"org_id":           e.OrgID,
		"status":           string(e.Status),
		"http_status":      e.HTTPStatus,
	}
	metrics := []emfMetric{{"Requests", "Count"}, {"BackendErrors", "Count"}, {"SlotsLost", "Count"}, {"Duration", "Milliseconds"},
		{"PromptTokens", "Count"}, {"CompletionTokens", "Count"}, {"CostUSD", "None"}}
	// Time to first byte only where a backend answered: a refused request's zero would drag the
	// percentiles down.
	if e.TTFTMillis > 0 {
		line["TimeToFirstByte"] = e.TTFTMillis
		metrics = append(metrics, emfMetric{"TimeToFirstByte", "Milliseconds"})
	}
	m.write(line, requestDimensions, metrics, now)
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
	m.write(map[string]any{name: 1, "org_id": orgID}, [][]string{{}}, []emfMetric{{name, "Count"}}, now)
}

func (m *Metrics) write(line map[string]any, dims [][]string, metrics []emfMetric, now time.Time) {
	line["_aws"] = emfMeta{Timestamp: now.UnixMilli(), CloudWatchMetrics: []emfDirective{{Namespace: m.namespace, Dimensions: dims, Metrics: metrics}}}
	b, err := json.Marshal(line)
	if err != nil {
		return // cannot happen: every value is a string or a number
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	_, _ = m.w.Write(append(b, '\n'))
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
