package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/neocloud/kiln/pkg/finance"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/usage"
)

// reconcileTask is the input of the daily schedule (template.yaml, the Reconcile event):
// {"task": "reconcile"} reconciles yesterday (UTC); {"task": "reconcile", "day": "2026-11-29"}
// that day, for an operator who invokes the function by hand.
const reconcileTask = "reconcile"

// The metric the reconciliation publishes, in CloudWatch's embedded metric format: a JSON line on
// stdout that CloudWatch Logs turns into the metric, with no PutMetricData call and no
// permission for one. ReconciliationAlarm in template.yaml fires on it.
const (
	metricNamespace   = "Kiln"
	metricDifferences = "ReconciliationDifferences"
	metricRequests    = "ReconciledRequests"
)

// function is the aggregator's entry point: SQS batches go to the ingest handler, the
// reconciliation's schedule to reconcile.
type function struct {
	ingest *usage.Handler
	tables finance.TableReader
	prefix string    // the table prefix, the metric's dimension (one stack's tables)
	stdout io.Writer // where the metric line goes
	log    *slog.Logger
	now    func() time.Time
}

// Invoke routes one invocation: the schedule's task to reconcile, an SQS batch (Records) to the
// ingest handler. Anything else is an error, so that a misrouted trigger is noticed.
func (f *function) Invoke(ctx context.Context, payload json.RawMessage) (any, error) {
	var in struct {
		events.SQSEvent
		Task       string `json:"task"`
		Day        string `json:"day"`
		Source     string `json:"source"` // an EventBridge event's, to name it in the error
		DetailType string `json:"detail-type"`
	}
	if err := json.Unmarshal(payload, &in); err != nil {
		return nil, fmt.Errorf("invocation payload: %w", err)
	}
	switch {
	case in.Task == reconcileTask:
		return f.reconcile(ctx, cmp.Or(in.Day, f.now().UTC().AddDate(0, 0, -1).Format(time.DateOnly)))
	case in.Task != "":
		return nil, fmt.Errorf("unknown task %q: want %q", in.Task, reconcileTask)
	case in.Records == nil:
		return nil, fmt.Errorf("unexpected invocation (source %q, detail-type %q): want an SQS batch", in.Source, in.DetailType)
	}
	return f.ingest.Handle(ctx, in.SQSEvent)
}

// reconciliation is what the reconcile invocation returns.
type reconciliation struct {
	Day             string `json:"day"`
	Agrees          bool   `json:"agrees"`
	Differences     int    `json:"differences"`
	Requests        int64  `json:"requests"`
	Organizations   int    `json:"organizations"`
	InProgress      int64  `json:"in_progress_skipped"`
	LedgerUSD       string `json:"ledger_usd"`
	UsageUSD        string `json:"usage_usd"`
	AggregatesUSD   string `json:"aggregates_usd"`
	FirstDifference string `json:"first_difference,omitempty"`
}

// reconcile reconciles one day from the tables and publishes the result as a metric. Figures
// that differ are a result, not a failure: the metric (and its alarm) says so. A table that
// cannot be read is a failure (the function's Errors alarm), and no metric is written, which
// the alarm treats as breaching too.
func (f *function) reconcile(ctx context.Context, day string) (reconciliation, error) {
	res, err := finance.ReconcileTables(ctx, f.tables, finance.Options{From: day, To: day, MaxListed: 20})
	if err != nil {
		return reconciliation{}, fmt.Errorf("reconcile %s: %w", day, err)
	}
	out := reconciliation{Day: day, Agrees: res.Agrees, Differences: res.DifferenceCount, InProgress: res.InProgress}
	var ledger, used, agg money.Amount
	orgs := map[string]bool{}
	disagreeing := 0
	for _, r := range res.Rows {
		orgs[r.OrgID] = true
		out.Requests += r.Requests
		a := money.Amount(0)
		if r.Aggregates != nil {
			a = *r.Aggregates
		}
		if ledger, err = ledger.Add(r.Ledger); err == nil {
			if used, err = used.Add(r.Usage); err == nil {
				agg, err = agg.Add(a)
			}
		}
		if err != nil {
			return reconciliation{}, fmt.Errorf("reconcile %s: the day's total: %w", day, err)
		}
		if !r.Agrees {
			disagreeing++
		}
	}
	out.Organizations = len(orgs)
	out.LedgerUSD, out.UsageUSD, out.AggregatesUSD = ledger.String(), used.String(), agg.String()
	// Every difference counts, and so does a day whose sums disagree without one (which the
	// reconciliation does not produce today, but the alarm must not depend on that).
	count := max(res.DifferenceCount, disagreeing)
	gens := []string{}
	for _, d := range res.Differences {
		if d.GenerationID != "" {
			gens = append(gens, d.GenerationID)
		}
	}
	if len(res.Differences) > 0 {
		d := res.Differences[0]
		out.FirstDifference = fmt.Sprintf("%s %s %s %s", d.Kind, d.OrgID, d.Day, d.GenerationID)
	}
	line, err := json.Marshal(map[string]any{
		"_aws": map[string]any{
			"Timestamp": f.now().UnixMilli(),
			"CloudWatchMetrics": []any{map[string]any{
				"Namespace":  metricNamespace,
				"Dimensions": [][]string{{"TablePrefix"}},
				"Metrics": []any{
					map[string]string{"Name": metricDifferences, "Unit": "Count"},
					map[string]string{"Name": metricRequests, "Unit": "Count"},
				},
			}},
		},
		"TablePrefix":     f.prefix,
		metricDifferences: count,
		metricRequests:    out.Requests,
		"day":             day,
		"organizations":   out.Organizations,
		"ledger_usd":      out.LedgerUSD,
		"usage_usd":       out.UsageUSD,
		"aggregates_usd":  out.AggregatesUSD,
		"generation_ids":  gens,
	})
	if err != nil {
		return reconciliation{}, err
	}
	if _, err := f.stdout.Write(append(line, '\n')); err != nil {
		return reconciliation{}, fmt.Errorf("write the reconciliation metric: %w", err)
	}
	level := slog.LevelInfo
	if count > 0 {
		level = slog.LevelWarn
	}
	f.log.LogAttrs(ctx, level, "reconciliation", slog.String("day", day), slog.Bool("agrees", res.Agrees),
		slog.Int("differences", count), slog.Int64("requests", out.Requests), slog.String("ledger_usd", out.LedgerUSD),
		slog.String("usage_usd", out.UsageUSD), slog.String("aggregates_usd", out.AggregatesUSD), slog.Any("generation_ids", gens))
	return out, nil
}
