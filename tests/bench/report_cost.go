package bench

import (
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strings"

	"github.com/neocloud/kiln/pkg/catalog"
)

// listPrices are AWS's us-east-1 list prices in dollars (issue 19; shared/NOTES.md; the pricing
// pages of each service, named in the report): per million of each unit, per GB-second and per
// GB as they are.
var listPrices = prices{
	GBSecond:   0.0000133334, // Lambda arm64
	Invocation: 0.20,         // Lambda requests
	WriteUnit:  0.625,        // DynamoDB on-demand write request units
	ReadUnit:   0.125,        // and read request units
	Pipe:       0.40,         // EventBridge Pipes, requests after filtering (64 KB chunks)
	SQS:        0.40,         // SQS standard, requests (each 64 KB chunk of a call)
	LogGB:      0.50,         // CloudWatch Logs standard ingestion
	REST:       3.50,         // API Gateway REST API requests
}

const (
	logEventOverhead  = 26 // bytes CloudWatch Logs counts per event beyond its message
	chunk64KB         = 64 * 1024
	aggregatorMemMB   = 256 // template.yaml, AggregatorFunction MemorySize
	typicalStreamSec  = 10.0
	typicalPrompt     = 500
	typicalCompletion = 500
	typicalModel      = "gpt-oss-120b"
	floorMemoryMB     = 128
	maxBillOverFloor  = 1.3
)

// platformLines are the lines Lambda writes per invocation in its text log format (START, END
// and REPORT; a 10 s stream at 128 MB), which SystemLogLevel WARN keeps out of CloudWatch Logs.
var platformLines = []string{
	"START RequestId: 8f4e1c2a-0b9f-4d2c-8000-000000000001 Version: 12",
	"END RequestId: 8f4e1c2a-0b9f-4d2c-8000-000000000001",
	"REPORT RequestId: 8f4e1c2a-0b9f-4d2c-8000-000000000001\tDuration: 10021.48 ms\tBilled Duration: 10022 ms\tMemory Size: 128 MB\tMax Memory Used: 38 MB\t",
}

// costView is the section of the Lambda memory comparison and the bill of a million requests.
type costView struct {
	Err                 error
	Controller          string
	Warm, Rounds        int
	Memory              table
	MaxAddedFirstByteMS int
	Chosen              int
	ColdAdded           string // what a cold start at the chosen size adds
	Bill                *billView
}

// dollars is one line of the bill of a million requests, before this change and now.
type dollars struct{ Before, Now float64 }

func (d dollars) plus(e dollars) dollars { return dollars{d.Before + e.Before, d.Now + e.Now} }

// billView is the bill of a million typical requests at the chosen memory, line by line, against
// the same requests before this change (1,024 MB, the fold one record at a time, Lambda's
// START/END/REPORT lines in the logs).
type billView struct {
	StreamSec                  float64
	Prompt, Completion         int
	Model                      string
	Chosen                     int
	OwnMS                      float64 // the gateway's own time around the model's stream
	Lambda, Requests, DynamoDB dollars
	WriteUnits, ReadUnits      float64 // per warm request
	Fold                       *foldBill
	Logs                       dollars
	LogBytes, LogLines         float64
	LogEventOverhead           int
	Platform                   int // bytes of Lambda's START/END/REPORT lines
	Total                      dollars
	FloorMB                    int
	Floor, MaxBillOverFloor    float64
	Met                        bool
	Revenue                    float64 // of the same requests at the reference catalog's price; 0 where it was not read
	Units                      table
	Calls                      float64     // calls per warm request
	Ops                        []pathUnits // write units per warm request by operation
	Tables                     []pathUnits // and by table or index
	Indexes                    bool        // a global secondary index is among Tables
	Extra, Leaves              float64     // beyond the floor now, and what the target leaves above it
	Prices                     prices
}

// prices are the list prices the bill uses.
type prices struct {
	GBSecond, Invocation, WriteUnit, ReadUnit, Pipe, SQS, LogGB, REST float64
}

// pathUnits is the write units per warm request of one operation, table or index of the
// request's path, as the capacity counter saw them.
type pathUnits struct {
	Name  string // the operation or the table
	Index string // the index of table Name; "" for the table itself
	Units float64
}

// foldBill is the lines of the bill after the request: the pipe, the queue and the aggregator.
type foldBill struct {
	Pipe, SQS, Fold, Lambda     dollars
	BodyBytes, BatchKB, PerCall float64
	Batched, Single, BatchMS    float64
	Batch, Records, MemoryMB    int
}

// lambdaCost fills the view of the memory comparison and of the bill.
func (r *Results) lambdaCost(v *reportView) {
	m := r.Cold.Lambda.memory
	if len(m.rounds) == 0 && m.err == nil {
		return
	}
	v.Cost = &costView{Err: m.err}
	if m.err != nil {
		return
	}
	first := func(s memoryStart) float64 { return s.firstByte }
	whole := func(s memoryStart) float64 { return s.whole }
	cold := func(s memoryStart) float64 { return s.cold }
	throttled := func(s memoryStart) float64 { return s.throttled }
	t := table{Head: []string{"memory", "CPU per 100 ms", "first byte, ms", "added first byte", "whole stream, ms", "added whole stream",
		"cold start, ms", "added cold start", "throttled periods"}}
	t.add("no limit", "100 ms", m.of(0, first).fmt("%.1f"), "", m.of(0, whole).fmt("%.1f"), "", m.of(0, cold).fmt("%.1f"), "", "")
	for _, mb := range lambdaMemorySizes {
		t.add(fmt.Sprintf("%d MB", mb), fmt.Sprintf("%.1f ms", 100*float64(mb)/lambdaFullCoreMB),
			m.of(mb, first).fmt("%.1f"), m.added(mb, first).fmt("%.1f"), m.of(mb, whole).fmt("%.1f"), m.added(mb, whole).fmt("%.1f"),
			m.of(mb, cold).fmt("%.1f"), m.added(mb, cold).fmt("%.1f"), m.of(mb, throttled).fmt("%.1f"))
	}
	c := v.Cost
	c.Controller, c.Warm, c.Rounds, c.Memory, c.MaxAddedFirstByteMS = m.controller, memoryWarmInvocations, len(m.rounds), t, maxAddedFirstByteMS
	if c.Chosen = m.chosen(); c.Chosen != 0 {
		c.ColdAdded = m.added(c.Chosen, cold).fmt("%.0f")
		c.Bill = r.bill(m, c.Chosen)
	}
}

// bill is the bill of a million typical requests at the chosen memory.
func (r *Results) bill(m lambdaMemory, chosen int) *billView {
	// The gateway's own time around the model's stream: the whole short stream, median.
	overhead := func(mb int) float64 {
		return m.of(mb, func(s memoryStart) float64 { return s.whole }).median() / 1000
	}
	p := listPrices
	// lambda is the dollars per million invocations of mb for sec, the request fee left out.
	lambda := func(mb int, sec float64) float64 { return float64(mb) / 1024 * sec * p.GBSecond * 1e6 }
	b := &billView{StreamSec: typicalStreamSec, Prompt: typicalPrompt, Completion: typicalCompletion, Model: typicalModel,
		Chosen: chosen, OwnMS: 1000 * overhead(chosen), FloorMB: floorMemoryMB, MaxBillOverFloor: maxBillOverFloor,
		Prices: p, LogBytes: m.logBytes, LogLines: m.logLines, LogEventOverhead: logEventOverhead,
		Lambda:   dollars{lambda(1024, typicalStreamSec+overhead(0)), lambda(chosen, typicalStreamSec+overhead(chosen))},
		Requests: dollars{p.Invocation, p.Invocation},
		Floor:    lambda(floorMemoryMB, typicalStreamSec) + p.Invocation}

	var wru, rru float64
	for _, o := range m.capacity {
		wru += o.Write
		rru += o.Read
	}
	b.WriteUnits, b.ReadUnits = wru/float64(m.requests), rru/float64(m.requests)
	path := b.WriteUnits*p.WriteUnit + b.ReadUnits*p.ReadUnit
	b.DynamoDB = dollars{path, path}
	b.Total = b.Lambda.plus(b.Requests).plus(b.DynamoDB)

	if f := m.fold; f.err == nil && f.records > 0 {
		pipe := p.Pipe // each record its own request: under 64 KB, and counted after filtering
		perCall := math.Ceil(10 * f.bodyBytes / chunk64KB)
		sqs := 3 * perCall / 10 * p.SQS // SendMessageBatch, ReceiveMessage, DeleteMessageBatch of 10
		agg := (lambda(aggregatorMemMB, f.batchMS/1000) + p.Invocation) / aggregatorBatch
		b.Fold = &foldBill{Pipe: dollars{pipe, pipe}, SQS: dollars{sqs, sqs}, Fold: dollars{f.single * p.WriteUnit, f.batched * p.WriteUnit},
			Lambda: dollars{agg, agg}, BodyBytes: f.bodyBytes, BatchKB: 10 * f.bodyBytes / 1024, PerCall: perCall,
			Batched: f.batched, Single: f.single, BatchMS: f.batchMS, Batch: aggregatorBatch, Records: f.records, MemoryMB: aggregatorMemMB}
		b.Total = b.Total.plus(b.Fold.Pipe).plus(b.Fold.SQS).plus(b.Fold.Fold).plus(b.Fold.Lambda)
	}

	for _, l := range platformLines {
		b.Platform += len(l) + 1 + logEventOverhead
	}
	appLog := m.logBytes + m.logLines*logEventOverhead
	logs := func(bytes float64) float64 { return bytes / 1e9 * p.LogGB * 1e6 }
	b.Logs = dollars{logs(appLog + float64(b.Platform)), logs(appLog)}
	b.Total = b.Total.plus(b.Logs)
	b.Met = b.Total.Now <= maxBillOverFloor*b.Floor
	b.Extra, b.Leaves = b.Total.Now-b.Floor, (maxBillOverFloor-1)*b.Floor
	if rev, err := revenue(r.Cfg.Repo); err == nil {
		b.Revenue = rev
	}

	b.Units = table{Head: []string{"table or index", "write units", "", "operation", "calls", "write units", "read units"}}
	tables, ops := slices.Sorted(maps.Keys(m.tables)), slices.Sorted(maps.Keys(m.capacity))
	per := func(x float64) string { return fmt.Sprintf("%.2f", x/float64(m.requests)) }
	for i := range max(len(tables), len(ops)) {
		cells := make([]string, 7)
		if i < len(tables) {
			cells[0], cells[1] = "`"+tables[i]+"`", per(m.tables[tables[i]])
		}
		if i < len(ops) {
			o := m.capacity[ops[i]]
			cells[3], cells[4], cells[5], cells[6] = ops[i], per(float64(o.Calls)), per(o.Write), per(o.Read)
		}
		b.Units.add(cells...)
	}
	for _, op := range ops {
		b.Calls += float64(m.capacity[op].Calls) / float64(m.requests)
		if w := m.capacity[op].Write; w > 0 { // the prose names what writes; a key lookup only reads
			b.Ops = append(b.Ops, pathUnits{Name: op, Units: w / float64(m.requests)})
		}
	}
	for _, t := range tables {
		// The counter names a global secondary index "table/index/name".
		name, index, _ := strings.Cut(t, "/index/")
		b.Indexes = b.Indexes || index != ""
		b.Tables = append(b.Tables, pathUnits{Name: name, Index: index, Units: m.tables[t] / float64(m.requests)})
	}
	return b
}

// revenue is what the typical request's tokens bring at the reference catalog's price, per
// million requests.
func revenue(repo string) (float64, error) {
	c, err := catalog.Load(filepath.Join(repo, "infra", "catalog.yaml"))
	if err != nil {
		return 0, err
	}
	md, ok := c.Model(typicalModel)
	if !ok {
		return 0, fmt.Errorf("no %s in the reference catalog", typicalModel)
	}
	cost, err := md.Pricing.Cost(typicalPrompt, 0, typicalCompletion)
	if err != nil {
		return 0, err
	}
	return float64(cost) / 1e12 * 1e6, nil
}
