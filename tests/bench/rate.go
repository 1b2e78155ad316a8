package bench

import (
	"fmt"
	"path/filepath"
	"slices"
	"time"
)

// A rate phase sends non-streamed requests at a fixed, low rate and reads the CPU the serving
// process used over the whole window, idle time included, from its CPU-time clock: what a
// request costs where nothing amortises a fixed cost per request or per second (on Lambda each
// instance serves one request at a time). The gateway is measured as the local server on each
// store and as the Lambda bootstrap under the loopback Runtime API on DynamoDB Local.

// server is one process that answers requests: a gateway as the local server, or the Lambda
// bootstrap serving one invocation at a time.
type server struct {
	name string
	pid  int
	send func() error // one non-streamed chat completion, read whole
}

// rateRow is one figure measured at one rate: the gateway, and the baseline gateway when the run
// has one, in the same rounds.
type rateRow struct {
	what     string // "embedded store", "DynamoDB Local", ...
	rate     float64
	target   float64 // ms of CPU per request the issue asks for; 0 for none
	gateway  server
	baseline *server
	gw, base []phase // one per round
	onAWS    bool    // the row is the path that runs on AWS
}

// cpuPerRequest is a rate phase's CPU of its server in ms per request answered.
func (p phase) cpuPerRequest() float64 { return perUnit(ms(p.cpu["server"]), p, false) }

// switchesPerRequest is a rate phase's context switches of its server's threads per request
// answered.
func (p phase) switchesPerRequest() float64 { return perUnit(float64(p.switches["server"]), p, false) }

// rateLoop sends requests to s at rate for dur (see paced), its CPU and context switches
// accounted as "server".
func (s server) rateLoop(rate float64, dur time.Duration) phase {
	return paced(rate, dur, 0, s.send, watch{"server": s.pid})
}

// rateResults are the rate phases of a run.
type rateResults struct {
	rows []*rateRow
	err  error    // what kept a row from being measured
	errs []string // what went wrong in the phases measured
}

// lowRate is the rate at which Lambda's figure is measured: one instance serving one request at
// a time, about every 50 ms.
const lowRate = 20

// measureRates runs the rate phases: the gateway st.gw (embedded store) at lowRate and at
// highRate, then, on DynamoDB Local, the local server and the Lambda bootstrap at lowRate; each
// with the baseline gateway (cfg.BaselineBin) beside it when there is one.
func measureRates(cfg Config, st *stack, logf func(string, ...any)) rateResults {
	var res rateResults
	sqlite := &rateRow{what: "embedded store", rate: lowRate, target: 1.2, gateway: st.server("gateway", st.gw, st.key)}
	sqliteHigh := &rateRow{what: "embedded store", rate: 500, gateway: sqlite.gateway}
	// What any Go net/http proxy costs here at the same rate: one request in, one round trip out.
	bare := &rateRow{what: "none (bare proxy)", rate: lowRate, gateway: server{name: "bare proxy", pid: st.proxy.pid(), send: sender(st.bare)}}
	res.rows = []*rateRow{bare, sqlite, sqliteHigh}

	var stop []func()
	defer func() {
		for _, f := range slices.Backward(stop) {
			f()
		}
	}()
	if cfg.BaselineBin != "" {
		p, key, err := st.startGateway("baseline gateway", cfg.BaselineBin, filepath.Join(st.dir, "baseline-rate"))
		if err != nil {
			res.err = err
			return res
		}
		stop = append(stop, p.stop)
		b := st.server("baseline", p, key)
		sqlite.baseline, sqliteHigh.baseline = &b, &b
	}

	dynamoRows, stopDynamo, err := dynamoRateRows(cfg, st)
	stop = append(stop, stopDynamo...)
	if err != nil {
		res.err = err
	}
	res.rows = append(res.rows, dynamoRows...)

	// Warm every server (connections, caches, the JVM behind DynamoDB Local), then measure in
	// rounds whose order reverses every round, the baseline beside the gateway.
	for _, row := range res.rows {
		for _, s := range row.servers() {
			s.rateLoop(row.rate, time.Second)
		}
	}
	for r := range cfg.RateRounds {
		for _, row := range alternate(r, res.rows) {
			dur := cfg.RateFor
			if row.rate > lowRate {
				dur = cfg.RateFor / 2 // many more requests in half the time
			}
			servers := row.servers()
			got := make([]phase, len(servers))
			for _, i := range alternate(r, []int{0, 1}[:len(servers)]) {
				s := servers[i]
				logf("rate %.0f/s, %s round %d: measuring %s (pid %d) for %v", row.rate, row.what, r+1, s.name, s.pid, dur)
				got[i] = s.rateLoop(row.rate, dur)
				logf("rate %.0f/s, %s round %d: %s %.3f ms CPU, %.1f context switches per request (%d requests, %d errors, p50 %v)",
					row.rate, row.what, r+1, s.name, got[i].cpuPerRequest(), got[i].switchesPerRequest(), len(got[i].total), got[i].errs, got[i].total.q(.5))
				if err := got[i].firstErr; err != nil {
					res.errs = append(res.errs, fmt.Sprintf("rate %.0f/s, %s round %d, %s: %v", row.rate, row.what, r+1, s.name, err))
				}
			}
			row.gw = append(row.gw, got[0])
			if row.baseline != nil {
				row.base = append(row.base, got[1])
			}
		}
	}
	return res
}

func (row *rateRow) servers() []*server {
	if row.baseline == nil {
		return []*server{&row.gateway}
	}
	return []*server{&row.gateway, row.baseline}
}

// dynamoRateRows starts DynamoDB Local with the benchmark's organization on its tables, a local
// server on them (and the baseline's, if any) and the Lambda bootstrap, and returns their rows
// at lowRate and what stops them.
func dynamoRateRows(cfg Config, st *stack) (rows []*rateRow, stop []func(), err error) {
	ddb, storeEnv, key, err := onDynamoDBLocal(st, "kilnrate-")
	if ddb != nil {
		stop = append(stop, ddb.Stop)
	}
	if err != nil {
		return nil, stop, fmt.Errorf("rate phases on DynamoDB Local: %w", err)
	}
	env := append(slices.Clone(st.env), storeEnv...)
	p, err := start("gateway on DynamoDB Local", st.gwBin, nil, env, filepath.Join(st.dir, "gateway-dynamodb.log"))
	if err != nil {
		return nil, stop, err
	}
	stop = append(stop, p.stop)
	local := &rateRow{what: "DynamoDB Local, local server", rate: lowRate, gateway: st.server("gateway", p, key)}
	if cfg.BaselineBin != "" {
		bp, err := start("baseline gateway on DynamoDB Local", cfg.BaselineBin, nil, env, filepath.Join(st.dir, "baseline-dynamodb.log"))
		if err != nil {
			return nil, stop, err
		}
		stop = append(stop, bp.stop)
		b := st.server("baseline", bp, key)
		local.baseline = &b
	}
	rows = append(rows, local)

	task, err := st.lambdaTask(cfg.Repo)
	if err != nil {
		return rows, stop, err
	}
	event, err := functionURLEvent(cfg.Repo, key, st.gateway.body(nonStreaming))
	if err != nil {
		return rows, stop, err
	}
	b, _, err := startBootstrap(task, storeEnv, nil, event, filepath.Join(st.dir, "lambda-rate.log"))
	if err != nil {
		return rows, stop, fmt.Errorf("Lambda bootstrap on DynamoDB Local: %w", err)
	}
	stop = append(stop, b.stop)
	rows = append(rows, &rateRow{what: "DynamoDB Local, Lambda bootstrap", rate: lowRate, target: 1, onAWS: true,
		gateway: server{name: "bootstrap", pid: b.pid(), send: func() error {
			_, _, err := b.invoke(event)
			return err
		}}})
	return rows, stop, nil
}
