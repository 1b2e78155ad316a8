package bench

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"

	"github.com/neocloud/kiln/pkg/catalog"
)

// AWS list prices, us-east-1, in dollars (issue 19; shared/NOTES.md; the pricing pages of each
// service, named in the report).
const (
	priceGBSecond     = 0.0000133334 // Lambda arm64, per GB-second
	priceInvocation   = 0.20 / 1e6   // Lambda, per request
	priceWriteUnit    = 0.625 / 1e6  // DynamoDB on-demand, per write request unit
	priceReadUnit     = 0.125 / 1e6  // DynamoDB on-demand, per read request unit
	pricePipeRequest  = 0.40 / 1e6   // EventBridge Pipes, per request after filtering (64 KB chunks)
	priceSQSRequest   = 0.40 / 1e6   // SQS standard, per request (each 64 KB chunk of a call)
	priceLogGB        = 0.50         // CloudWatch Logs standard ingestion, per GB
	priceRESTRequest  = 3.50 / 1e6   // API Gateway REST API, per request
	logEventOverhead  = 26           // bytes CloudWatch Logs counts per event beyond its message
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

// billLine is one line of the bill of a million requests: before this change and now.
type billLine struct {
	what, counted string
	before, now   float64 // dollars per million requests
}

// reportLambdaCost writes the memory comparison and the bill of a million typical requests.
func (r *Results) reportLambdaCost(p func(format string, args ...any)) {
	m := r.Cold.lambda.memory
	if len(m.rounds) == 0 && m.err == nil {
		return
	}
	p("## Lambda memory, and what a million requests cost on AWS")
	p("")
	if m.err != nil {
		p("Not measured: %v.", m.err)
		p("")
		return
	}
	p("The gateway's Lambda `bootstrap` (as in the cold start above) on DynamoDB Local, its CPU held as Lambda holds a function")
	p("of each memory size: %s, a quota of memory / 1,769 MB of one core per 100 ms period (Lambda's own", m.controller)
	p("host has more cores; the quota per period is what matters). Each start answers a cold invocation and %d warm ones of a", memoryWarmInvocations)
	p("16-token stream (`qwen3-32b` on the simulator, which is not limited, nor is DynamoDB Local); first byte is from queueing")
	p("an invocation to its first `data:` event, whole until the end of the response (settlement included). \"Added\" is")
	p("against a start without a limit in the same round; %d rounds, sizes in alternating order; medians of the warm", len(m.rounds))
	p("invocations per start, then median (lo … hi) over the rounds. Throttled is how many 100 ms periods per warm")
	p("invocation the limit held the process back (`cpu.stat` `nr_throttled`).")
	p("")
	first := func(s memoryStart) float64 { return s.firstByte }
	whole := func(s memoryStart) float64 { return s.whole }
	cold := func(s memoryStart) float64 { return s.cold }
	throttled := func(s memoryStart) float64 { return s.throttled }
	p("| memory | CPU per 100 ms | first byte, ms | added first byte | whole stream, ms | added whole stream | cold start, ms | added cold start | throttled periods |")
	p("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	p("| no limit | 100 ms | %s | | %s | | %s | | |", m.of(0, first).fmt("%.1f"), m.of(0, whole).fmt("%.1f"), m.of(0, cold).fmt("%.1f"))
	for _, mb := range lambdaMemorySizes {
		p("| %d MB | %.1f ms | %s | %s | %s | %s | %s | %s | %s |", mb, 100*float64(mb)/lambdaFullCoreMB,
			m.of(mb, first).fmt("%.1f"), m.added(mb, first).fmt("%.1f"), m.of(mb, whole).fmt("%.1f"), m.added(mb, whole).fmt("%.1f"),
			m.of(mb, cold).fmt("%.1f"), m.added(mb, cold).fmt("%.1f"), m.of(mb, throttled).fmt("%.1f"))
	}
	p("")
	chosen := m.chosen()
	if chosen == 0 {
		p("No size adds %d ms or less to the first byte: the template's default stays as it is.", maxAddedFirstByteMS)
		p("")
		return
	}
	p("**The template's default (`GatewayMemorySize`) is %d MB**: the smallest size that adds no more than %d ms to the first", chosen, maxAddedFirstByteMS)
	p("byte (median over the rounds). What happens before the first byte — the key lookup (cached), admission (one")
	p("`UpdateItem`), the backend's request — takes a few ms of CPU, inside one period's quota; the wait for the model is not")
	p("CPU. Memory buys nothing a stream needs, and Lambda bills memory × the stream's whole duration. A cold start at %d MB", chosen)
	p("adds %s ms to the first response (here its init runs on the same quota).", m.added(chosen, cold).fmt("%.0f"))
	p("")

	r.reportBill(p, m, chosen)
}

// reportBill writes the bill of a million typical requests at the chosen memory, line by line,
// against the same requests before this change (1,024 MB, the fold one record at a time, Lambda's
// START/END/REPORT lines in the logs).
func (r *Results) reportBill(p func(format string, args ...any), m lambdaMemory, chosen int) {
	f := m.fold
	// The gateway's own time around the model's stream: the whole short stream, median.
	overhead := func(mb int) float64 {
		return m.of(mb, func(s memoryStart) float64 { return s.whole }).median() / 1000
	}
	gbs := func(mb int, sec float64) float64 { return float64(mb) / 1024 * sec }
	lambdaNow := gbs(chosen, typicalStreamSec+overhead(chosen)) * priceGBSecond * 1e6
	lambdaBefore := gbs(1024, typicalStreamSec+overhead(0)) * priceGBSecond * 1e6
	floor := gbs(floorMemoryMB, typicalStreamSec)*priceGBSecond*1e6 + priceInvocation*1e6

	var wru, rru float64
	for _, o := range m.capacity {
		wru += o.Write
		rru += o.Read
	}
	wru, rru = wru/float64(m.requests), rru/float64(m.requests)
	gatewayDDB := (wru*priceWriteUnit + rru*priceReadUnit) * 1e6

	platform := 0
	for _, l := range platformLines {
		platform += len(l) + 1 + logEventOverhead
	}
	appLog := m.logBytes + m.logLines*logEventOverhead
	logs := func(bytes float64) float64 { return bytes / 1e9 * priceLogGB * 1e6 }

	lines := []billLine{
		{"Lambda, gateway: GB-seconds", fmt.Sprintf("%d MB × (%.0f s + the gateway's own %.0f ms: the whole short stream above); before, 1,024 MB",
			chosen, typicalStreamSec, 1000*overhead(chosen)), lambdaBefore, lambdaNow},
		{"Lambda, gateway: requests", "$0.20 per million", priceInvocation * 1e6, priceInvocation * 1e6},
		{"DynamoDB, the request's path", fmt.Sprintf("%.2f write units, %.2f read units per warm request, counted (table below)", wru, rru), gatewayDDB, gatewayDDB},
	}
	var pipeNow, sqsNow, foldBefore, foldNow, aggLambda float64
	if f.err == nil && f.records > 0 {
		pipeNow = pricePipeRequest * 1e6 // each record its own request: under 64 KB, and counted after filtering
		perCall := math.Ceil(10 * f.bodyBytes / chunk64KB)
		sqsNow = 3 * perCall / 10 * priceSQSRequest * 1e6 // SendMessageBatch, ReceiveMessage, DeleteMessageBatch of 10
		foldBefore, foldNow = f.single*priceWriteUnit*1e6, f.batched*priceWriteUnit*1e6
		aggLambda = (gbs(aggregatorMemMB, f.batchMS/1000)*priceGBSecond + priceInvocation) / aggregatorBatch * 1e6
		lines = append(lines,
			billLine{"EventBridge Pipe", fmt.Sprintf("one request per record after the filter (each %.0f B, under 64 KB)", f.bodyBytes), pipeNow, pipeNow},
			billLine{"SQS", fmt.Sprintf("send, receive and delete, 10 messages (%.0f KB) a call, %.0f request each", 10*f.bodyBytes/1024, perCall), sqsNow, sqsNow},
			billLine{"DynamoDB, the aggregator's fold", fmt.Sprintf("%.2f write units per record in batches of up to %d (%d records of one organization, model and day); before, %.2f one at a time",
				f.batched, aggregatorBatch, f.records, f.single), foldBefore, foldNow},
			billLine{"Lambda, aggregator", fmt.Sprintf("%d MB × %.0f ms per batch of %d, plus its request", aggregatorMemMB, f.batchMS, aggregatorBatch), aggLambda, aggLambda},
		)
	}
	lines = append(lines,
		billLine{"CloudWatch Logs, gateway", fmt.Sprintf("%.0f B in %.0f lines per request (request log and metrics), + %d B per line; before, + Lambda's START/END/REPORT (%d B)",
			m.logBytes, m.logLines, logEventOverhead, platform), logs(appLog + float64(platform)), logs(appLog)})
	var before, now float64
	for _, l := range lines {
		before += l.before
		now += l.now
	}
	p("What a million typical requests cost on AWS: a %.0f s stream of %d prompt + %d completion tokens on `%s`, through a", typicalStreamSec, typicalPrompt, typicalCompletion, typicalModel)
	p("function URL (no charge of its own). Prices are AWS's us-east-1 list prices: Lambda arm64 $0.0000133334 per GB-s and")
	p("$0.20 per million requests; DynamoDB on-demand $0.625 per million write and $0.125 per million read units (a")
	p("transactional write is 2 units per KB and item); Pipes $0.40 and SQS $0.40 per million requests (64 KB chunks);")
	p("CloudWatch Logs $0.50 per GB ingested. DynamoDB units are counted by a proxy in front of DynamoDB Local that asks every")
	p("call for `ReturnConsumedCapacity` (and takes 2 units per item of a transaction: DynamoDB Local reports one item's units")
	p("per table). The pipe's messages are read off DynamoDB Local's stream by `pkg/usage/pipe`, and folded as the aggregator")
	p("does. Per million requests, in dollars:")
	p("")
	p("| line | counted as | before | now |")
	p("| --- | --- | --- | --- |")
	for _, l := range lines {
		p("| %s | %s | %.2f | %.2f |", l.what, l.counted, l.before, l.now)
	}
	p("| **total** | | **%.2f** | **%.2f** |", before, now)
	p("| floor: %d MB × %.0f s + the request fee | | %.2f | %.2f |", floorMemoryMB, typicalStreamSec, floor, floor)
	p("| total / floor (target ≤ %.1f) | | %.2f | %.2f (%s) |", maxBillOverFloor, before/floor, now/floor, verdict(now <= maxBillOverFloor*floor))
	if rev, err := revenue(r.Cfg.Repo); err == nil {
		p("| token revenue of the same requests (reference catalog) | | %.2f | %.2f |", rev, rev)
	}
	p("")
	p("Through the REST API (the template's default entrance) API Gateway adds $%.2f per million, more than everything above", priceRESTRequest*1e6)
	p("but Lambda together; the function URL (`FunctionUrlEnabled`) adds nothing.")
	p("")
	p("DynamoDB units of the request's path, per warm request, by table (the cold invocations' key lookups not included):")
	p("")
	p("| table or index | write units | | operation | calls | write units | read units |")
	p("| --- | --- | --- | --- | --- | --- | --- |")
	tables := slices.Sorted(func(yield func(string) bool) {
		for t := range m.tables {
			if !yield(t) {
				return
			}
		}
	})
	ops := slices.Sorted(func(yield func(string) bool) {
		for o := range m.capacity {
			if !yield(o) {
				return
			}
		}
	})
	for i := range max(len(tables), len(ops)) {
		row := "|"
		if i < len(tables) {
			row += fmt.Sprintf(" `%s` | %.2f | |", tables[i], m.tables[tables[i]]/float64(m.requests))
		} else {
			row += " | | |"
		}
		if i < len(ops) {
			o := m.capacity[ops[i]]
			row += fmt.Sprintf(" %s | %.2f | %.2f | %.2f |", ops[i], float64(o.Calls)/float64(m.requests), o.Write/float64(m.requests), o.Read/float64(m.requests))
		} else {
			row += " | | | |"
		}
		p("%s", row)
	}
	p("")
	extra := now - floor
	p("Everything beyond the floor comes to $%.2f per million, where %.1f × leaves $%.2f. The request's path alone writes %.0f", extra, maxBillOverFloor, (maxBillOverFloor-1)*floor, wru)
	p("units ($%.2f): admission's `UpdateItem` (1) and settlement's `TransactWriteItems` of the organization, the usage record", gatewayDDB)
	p("and the ledger debit (2 each), plus the usage record's entry in the `by-started` index (2). Every one of them carries a")
	p("guarantee (a slot and a reservation; an exact, idempotent debit; the record the pipeline and `/v1/generation` read;")
	p("usage by time). Where the target is missed, it is not met without changing the data model; docs/deploy.md (section 12)")
	p("names the changes that would close the gap and what each gives up.")
	p("")
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
