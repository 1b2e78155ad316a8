package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
	"github.com/neocloud/kiln/tests/internal/build"
)

// Config is what a run measures and how long.
type Config struct {
	Repo        string        // the repository root (holds go.mod)
	GatewayBin  string        // a built gateway; "" builds ./functions/gateway
	Rounds      int           // rounds of every comparison
	Duration    time.Duration // measured window of one closed-loop phase
	Warmup      time.Duration // before each phase's window
	Conns       []int         // closed-loop connection counts
	OpenRate    float64       // open-loop requests per second
	OpenFor     time.Duration // one open-loop phase
	Streams     int           // concurrent slow streams for the memory figure
	ColdStarts  int           // cold-start rounds
	GoBenchRuns int           // -count of the Go micro-benchmarks; 0 skips them
	RateFor     time.Duration // one rate phase at 20/s (half that at 500/s); 0 skips them
	RateRounds  int           // rounds of the rate phases
	OnlyRates   bool          // measure the rate phases (and the baseline comparison) and nothing else
	// BaselineBin is a second gateway binary (another commit's) measured beside GatewayBin in the
	// same rounds; "" for none.
	BaselineBin string
	Log         *os.File // progress
}

// Results is everything a run measured; Report renders it.
type Results struct {
	Cfg       Config
	Started   time.Time
	LoadStart string         // load average when the run began
	Closed    map[int][]pair // by connections: one pair per round
	Short     []pair         // short streams at 8 connections
	Long      map[int][]pair // 1,000-token streams, by connections (1 and 8)
	Open      []pair
	Rates     rateResults
	Baseline  baselineResults // with Config.BaselineBin
	Memory    memory
	Cold      cold
	GoBench   []*goBench
	GoCmd     string
	// Store is the DynamoDB store's admission and settlement benchmark (StoreCmd runs it).
	Store    []*goBench
	StoreCmd string
	Errors   []string
}

// pair is one round of the same load against both targets, and, in the non-streaming phases,
// against the bare proxy too (empty in the others), indexed by side.
type pair [3]phase

// memory is, per round, what the slow streams held in each side's fresh processes, and the
// gateway's live heap and stacks, measured on a stack of its own.
type memory struct {
	Streams int
	Rounds  [][3]idle // by side
	Err     error
	Live    liveMemoryResult
	LiveErr error
}

// idle is what the slow streams through one side held in one round: in the process in front (the
// simulator itself when called directly) and in the simulator behind it.
type idle struct{ front, behind held }

// held is one process's RSS before the streams through it opened and while they were open.
type held struct {
	opened       int
	before, with int64
}

func (h held) perStream() float64 { return float64(h.with-h.before) / float64(h.opened) }

// held is, over the rounds in which streams opened, what they held in the process in front of
// via, or in the simulator behind it.
func (m memory) held(via side, behind bool) []held {
	var hs []held
	for _, r := range m.Rounds {
		h := r[via].front
		if behind {
			h = r[via].behind
		}
		if h.opened > 0 {
			hs = append(hs, h)
		}
	}
	return hs
}

// perStream is, per round, the RSS per open stream in the process in front of via, in KiB.
func (m memory) perStream(via side) spread {
	return perRound(m.held(via, false), func(h held) float64 { return kib(h.perStream()) })
}

// cold is the cold starts: ms from exec to the first 200, per round.
type cold struct {
	Gateway, Sim spread
	Err          error
	Lambda       lambdaCold
}

// stack is the running simulator, gateway and bare proxy.
type stack struct {
	dir, repo, simBin, gwBin, ctlBin, proxyBin string
	sim, gw, proxy                             *proc
	env                                        []string
	key                                        string
	direct, gateway, bare                      target
}

// Run builds the binaries, starts the stack, runs every phase and returns what it measured.
func Run(cfg Config) (*Results, error) {
	res := &Results{Cfg: cfg, Started: time.Now().UTC(), LoadStart: loadAvg(), Closed: map[int][]pair{}, Long: map[int][]pair{}}
	logf := func(format string, args ...any) { fmt.Fprintf(cfg.Log, format+"\n", args...) }
	// note adds err, if any, to the run's errors.
	note := func(err error) {
		if err != nil {
			res.Errors = append(res.Errors, err.Error())
		}
	}
	st, err := setUp(cfg)
	if err != nil {
		return nil, err
	}
	defer st.close()
	// The load generator is this process: its CPU completes the account of what a request costs.
	all := watch{"gateway": st.gw.pid(), "simulator": st.sim.pid(), "bareproxy": st.proxy.pid(), "loadgen": os.Getpid()}
	logf("process ids (for perf record -p): %v", all)

	// Sanity: each kind of request through every target, whole; through the bare proxy, those
	// it is measured on: non-streamed, and streams (the memory phase's).
	for _, t := range []target{st.direct, st.gateway, st.bare} {
		kinds := []requestKind{nonStreaming, shortStream, longStream}
		if t.name == st.bare.name {
			kinds = kinds[:2]
		}
		for _, k := range kinds {
			c := newClient(1)
			r, err := call(context.Background(), c, t, t.body(k), k != nonStreaming)
			c.CloseIdleConnections()
			if err != nil {
				return nil, fmt.Errorf("sanity request %d to %s: %w", k, t.name, err)
			}
			if k != nonStreaming && r.chunks < k.tokens() {
				return nil, fmt.Errorf("sanity stream to %s: %d events for %d tokens", t.name, r.chunks, k.tokens())
			}
		}
	}
	logf("warming up")
	for _, t := range []target{st.direct, st.gateway, st.bare} {
		closedLoop(t, nonStreaming, 8, 0, time.Second, all)
	}
	rates := func() {
		if cfg.RateFor > 0 {
			logf("rate phases: %d rounds of %v at %d/s", cfg.RateRounds, cfg.RateFor, lowRate)
			res.Rates = measureRates(cfg, st, logf)
			note(res.Rates.err)
			res.Errors = append(res.Errors, res.Rates.errs...)
		}
		if cfg.BaselineBin != "" {
			logf("side by side with the baseline gateway %s: %d rounds", cfg.BaselineBin, cfg.Rounds)
			res.Baseline = compareBaseline(cfg, st, logf)
			note(res.Baseline.err)
		}
	}
	if cfg.OnlyRates {
		rates()
		return res, nil
	}

	logf("memory: %d slow streams, %d rounds in fresh processes", cfg.Streams, cfg.Rounds)
	res.Memory = measureMemory(cfg, st, logf)
	logf("memory: live heap and stacks of %d slow streams", cfg.Streams)
	res.Memory.Live, res.Memory.LiveErr = measureLiveMemory(st, cfg.Streams)

	// rounds measures the direct target and the gateway, and the bare proxy too when bare,
	// cfg.Rounds times. The order reverses every round (direct, bare, gateway; then gateway,
	// bare, direct) so that a steady drift in the machine's speed hits all of them alike.
	rounds := func(what string, bare bool, measure func(target) phase) []pair {
		targets, order := [3]target{st.direct, st.gateway, st.bare}, []side{ofDirect, ofBare, ofGateway}
		if !bare {
			order = []side{ofDirect, ofGateway}
		}
		var ps []pair
		for r := range cfg.Rounds {
			var p pair
			for _, s := range alternate(r, order) {
				p[s] = measure(targets[s])
			}
			line := fmt.Sprintf("%s round %d: direct %s; gateway %s", what, r+1, p[ofDirect].summary(), p[ofGateway].summary())
			if bare {
				line += "; bare proxy " + p[ofBare].summary()
			}
			logf("%s", line)
			for _, s := range order {
				if err := p[s].firstErr; err != nil {
					res.Errors = append(res.Errors, fmt.Sprintf("%s round %d: %v", what, r+1, err))
				}
			}
			ps = append(ps, p)
		}
		return ps
	}
	for _, n := range cfg.Conns {
		res.Closed[n] = rounds(fmt.Sprintf("non-streaming, %d connections", n), true,
			func(t target) phase { return closedLoop(t, nonStreaming, n, cfg.Warmup, cfg.Duration, all) })
	}
	res.Short = rounds("streaming 16 tokens, 8 connections", false,
		func(t target) phase { return closedLoop(t, shortStream, 8, cfg.Warmup, cfg.Duration, all) })
	// At one connection the cores are mostly idle: the gateway's reads find fewer chunks, and its
	// threads sleep and wake more often; at eight it is busy and its reads find more chunks waiting.
	for _, n := range []int{1, 8} {
		res.Long[n] = rounds("streaming 1,000 tokens, "+connections(n), false,
			func(t target) phase { return closedLoop(t, longStream, n, cfg.Warmup, cfg.Duration, all) })
	}
	if cfg.OpenRate > 0 {
		res.Open = rounds(fmt.Sprintf("open loop %.0f/s", cfg.OpenRate), true,
			func(t target) phase { return openLoop(t, cfg.OpenRate, cfg.OpenFor, all) })
	}

	rates()

	logf("cold start: %d rounds", cfg.ColdStarts)
	st.gw.stop()
	st.proxy.stop()
	res.Cold = measureColdStart(st, cfg.ColdStarts)
	logf("Lambda bootstrap cold start: %d rounds on each store", cfg.ColdStarts)
	res.Cold.Lambda = measureLambdaColdStart(st, cfg.Repo, cfg.ColdStarts)
	if err := res.Cold.Lambda.Err; err != nil {
		logf("Lambda bootstrap cold start: %v", err)
	}
	st.sim.stop()

	if cfg.GoBenchRuns > 0 {
		res.GoBench, res.GoCmd, err = runGoBench(cfg.Repo, cfg.GoBenchRuns, cfg.Log)
		note(err)
		logf("store benchmark: admission and settlement on DynamoDB Local and moto")
		res.Store, res.StoreCmd, err = runStoreBench(cfg.Repo, cfg.GoBenchRuns, cfg.Log)
		note(err)
	}
	return res, nil
}

// setUp builds the binaries and starts the simulator, the bare proxy in front of it and the
// gateway, with an organization that load cannot exhaust.
func setUp(cfg Config) (_ *stack, err error) {
	dir, err := os.MkdirTemp("", "kilnbench-")
	if err != nil {
		return nil, err
	}
	st := &stack{dir: dir, repo: cfg.Repo, gwBin: cfg.GatewayBin}
	defer func() {
		if err != nil {
			st.proxy.stop()
			st.sim.stop()
		}
	}()
	bins, err := build.In(cfg.Repo, dir, []string{"-trimpath"}, "./tests/bench/cmd/simserver", "./infra/kilnctl", "./tests/bench/cmd/bareproxy")
	if err != nil {
		return nil, err
	}
	st.simBin, st.ctlBin, st.proxyBin = bins[0], bins[1], bins[2]
	if st.gwBin == "" {
		if bins, err = build.In(cfg.Repo, dir, []string{"-trimpath"}, "./functions/gateway"); err != nil {
			return nil, err
		}
		st.gwBin = bins[0]
	}

	if st.sim, err = st.startSim(dir); err != nil {
		return nil, err
	}
	if st.proxy, err = st.startProxy(dir, st.sim); err != nil {
		return nil, err
	}
	catalogPath, err := writeCatalog(cfg.Repo, dir, st.sim)
	if err != nil {
		return nil, err
	}
	st.env = []string{
		"KILN_ADDR=127.0.0.1:0",
		"KILN_CATALOG=" + catalogPath,
		"KILN_DATA_DIR=" + filepath.Join(dir, "data"),
		"KILN_SHUTDOWN_GRACE=2s",
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
	}
	if st.gw, st.key, err = st.startGateway("gateway", st.gwBin, dir); err != nil {
		return nil, err
	}
	st.direct = target{name: "direct", url: st.sim.base + "/chat/completions", model: "Qwen/Qwen3-32B",
		streamOptions: `{"include_usage":true,"continuous_usage_stats":true}`}
	st.gateway = target{name: "gateway", url: st.gw.base + "/chat/completions", key: st.key, model: "qwen3-32b",
		streamOptions: `{"include_usage":true}`}
	// The bare proxy passes the path through, so it is sent exactly what the simulator is.
	st.bare = st.direct
	st.bare.name, st.bare.url = "bare proxy", st.proxy.base+"/chat/completions"
	return st, nil
}

// startSim starts a simulator, its log in dir.
func (st *stack) startSim(dir string) (*proc, error) {
	return start("simulator", st.simBin, nil, []string{"PATH=" + os.Getenv("PATH")}, filepath.Join(dir, "simserver.log"))
}

// startProxy starts the bare proxy in front of the simulator sim, its log in dir.
func (st *stack) startProxy(dir string, sim *proc) (*proc, error) {
	return start("bare proxy", st.proxyBin, []string{"-upstream", "http://" + sim.host()},
		[]string{"PATH=" + os.Getenv("PATH")}, filepath.Join(dir, "bareproxy.log"))
}

// writeCatalog writes in dir the reference catalog with its backends at the simulator sim, and
// returns its path.
func writeCatalog(repo, dir string, sim *proc) (string, error) {
	ref, err := os.ReadFile(filepath.Join(repo, "infra", "catalog.yaml"))
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "catalog.yaml")
	return path, os.WriteFile(path, bytes.ReplaceAll(ref, []byte("127.0.0.1:8090"), []byte(sim.host())), 0o600)
}

// startGateway starts the gateway binary bin with the benchmark's organization on an embedded
// store of its own under dir (two processes do not share one), its log there too, and returns
// it with the organization's key; env is added to the run's (a later entry wins).
func (st *stack) startGateway(name, bin, dir string, env ...string) (*proc, string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	env = slices.Concat(st.env, []string{"KILN_DATA_DIR=" + filepath.Join(dir, "data")}, env)
	key, err := seedOrg(st.ctlBin, env)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", name, err)
	}
	p, err := start(name, bin, nil, env, filepath.Join(dir, "gateway.log"))
	return p, key, err
}

// close stops the stack's processes and removes its directory.
func (st *stack) close() {
	st.proxy.stop()
	st.gw.stop()
	st.sim.stop()
	os.RemoveAll(st.dir)
}

// through is the gateway's target at the gateway process p, with the organization's key.
func (st *stack) through(p *proc, key string) target {
	t := st.gateway
	t.url, t.key = p.base+"/chat/completions", key
	return t
}

// server is the gateway process p, sent non-streamed requests with key.
func (st *stack) server(name string, p *proc, key string) server {
	return server{name: name, pid: p.pid(), send: sender(st.through(p, key))}
}

// sender sends a non-streamed chat completion to t and reads it whole, on one client.
func sender(t target) func() error {
	c, body := newClient(16), t.body(nonStreaming)
	return func() error {
		_, err := call(context.Background(), c, t, body, false)
		return err
	}
}

// onDynamoDBLocal starts DynamoDB Local, creates through kilnctl the tables under prefix and the
// benchmark's organization on them, and returns the server (which the caller stops, also after
// an error), the store's environment for a gateway and the organization's key.
func onDynamoDBLocal(st *stack, prefix string) (*dynamotest.Server, []string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ddb, err := dynamotest.StartDynamoDBLocal(ctx)
	if err != nil {
		return nil, nil, "", err
	}
	env := []string{"KILN_STORE=dynamodb", "KILN_DYNAMODB_ENDPOINT=" + ddb.Endpoint, "KILN_TABLE_PREFIX=" + prefix, "AWS_REGION=us-east-1"}
	ctlEnv := append(slices.Clone(st.env), env...)
	if _, err := kilnctl(st.ctlBin, ctlEnv, "dev", "create-tables", "--json"); err != nil {
		return ddb, nil, "", err
	}
	key, err := seedOrg(st.ctlBin, ctlEnv)
	return ddb, env, key, err
}

// freeAddr is a loopback address nothing listened on a moment ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// measureMemory reads, in cfg.Rounds rounds whose order reverses every round, the RSS that
// cfg.Streams slow streams hold in each side's processes, started afresh for each (idleFresh).
func measureMemory(cfg Config, st *stack, logf func(string, ...any)) memory {
	m := memory{Streams: cfg.Streams}
	names := [3]string{st.direct.name, st.gateway.name, st.bare.name}
	for r := range cfg.Rounds {
		var round [3]idle
		for _, s := range alternate(r, []side{ofDirect, ofBare, ofGateway}) {
			var err error
			if round[s], err = st.idleFresh(s, st.gwBin, cfg.Streams); err != nil {
				m.Err = errors.Join(m.Err, fmt.Errorf("%s, round %d: %w", names[s], r+1, err))
			}
		}
		logf("memory round %d: %.1f KiB per idle stream directly, %.1f through the gateway, %.1f through the bare proxy", r+1,
			kib(round[ofDirect].front.perStream()), kib(round[ofGateway].front.perStream()), kib(round[ofBare].front.perStream()))
		m.Rounds = append(m.Rounds, round)
	}
	return m
}

// idleFresh starts, in a directory of its own, a simulator and in front of it what via names
// (nothing when direct; gwBin on an embedded store of its own when the gateway), so that no
// earlier phase has grown their heaps, and returns what n slow streams through them hold in the
// process in front and in the simulator behind it; then it stops them. One 16-token stream goes
// through first, so that what a first request sets up once is not counted as the streams'.
func (st *stack) idleFresh(via side, gwBin string, n int) (idle, error) {
	dir, err := os.MkdirTemp(st.dir, "idle-")
	if err != nil {
		return idle{}, err
	}
	sim, err := st.startSim(dir)
	if err != nil {
		return idle{}, err
	}
	defer sim.stop()
	t, front := st.direct, sim
	t.url = sim.base + "/chat/completions"
	switch via {
	case ofBare:
		if front, err = st.startProxy(dir, sim); err != nil {
			return idle{}, err
		}
		t.url = front.base + "/chat/completions"
	case ofGateway:
		catalog, err := writeCatalog(st.repo, dir, sim)
		if err != nil {
			return idle{}, err
		}
		var key string
		if front, key, err = st.startGateway("gateway", gwBin, dir, "KILN_CATALOG="+catalog); err != nil {
			return idle{}, err
		}
		t = st.through(front, key)
	}
	if front != sim {
		defer front.stop()
	}
	c := newClient(1)
	_, err = call(context.Background(), c, t, t.body(shortStream), true)
	c.CloseIdleConnections()
	if err != nil {
		return idle{}, fmt.Errorf("the first stream: %w", err)
	}

	w := watch{"front": front.pid(), "behind": sim.pid()}
	before := read(w, rss)
	opened, closeAll, err := openStreams(t, n, 30*time.Second)
	defer closeAll()
	time.Sleep(500 * time.Millisecond)
	with := read(w, rss)
	if opened == 0 || len(before)+len(with) < 2*len(w) {
		err = errors.Join(err, fmt.Errorf("%d of %d streams opened, RSS read of %d processes before and %d with them", opened, n, len(before), len(with)))
	}
	res := idle{front: held{opened, before["front"], with["front"]}}
	if front != sim {
		res.behind = held{opened, before["behind"], with["behind"]}
	}
	return res, err
}

// measureColdStart times, for each binary, exec to the first 200 answer to a chat completion;
// the gateway restarts on the data directory the run already created.
func measureColdStart(st *stack, rounds int) (c cold) {
	for r := range rounds {
		took, err := coldStart("simulator", st.simBin, []string{"PATH=" + os.Getenv("PATH")}, st.direct, filepath.Join(st.dir, "cold-sim.log"))
		if err != nil {
			c.Err = err
			return c
		}
		c.Sim = append(c.Sim, took)
		if took, err = coldStart("gateway", st.gwBin, st.env, st.gateway, filepath.Join(st.dir, fmt.Sprintf("cold-gw-%d.log", r))); err != nil {
			c.Err = err
			return c
		}
		c.Gateway = append(c.Gateway, took)
	}
	return c
}

// coldStart starts bin with env (see start) and returns the milliseconds from its exec until a
// chat completion to t there first answers 200.
func coldStart(name, bin string, env []string, t target, logPath string) (float64, error) {
	p, err := start(name, bin, nil, env, logPath)
	if err != nil {
		return 0, err
	}
	defer p.stop()
	t.url = p.base + "/chat/completions"
	body := t.body(nonStreaming)
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for time.Since(p.started) < 10*time.Second {
		if _, err := call(context.Background(), c, t, body, false); err == nil {
			return ms(time.Since(p.started)), nil
		}
		time.Sleep(200 * time.Microsecond)
	}
	return 0, fmt.Errorf("%s: no 200 within 10 s", name)
}

// seedOrg creates, through kilnctl on the store env names, the benchmark's organization and
// returns its key. The demo organization allows 8 requests in flight and $10; the benchmark's
// allows more than any phase opens, with credits no run can spend.
func seedOrg(ctlBin string, env []string) (string, error) {
	if _, err := kilnctl(ctlBin, env, "org", "create", "--id", "org_bench", "--name", "bench", "--max-in-flight", "5000", "--json"); err != nil {
		return "", err
	}
	out, err := kilnctl(ctlBin, env, "key", "create", "--org", "org_bench", "--json")
	if err != nil {
		return "", err
	}
	var k struct{ Key string }
	if err := json.Unmarshal(out, &k); err != nil || k.Key == "" {
		return "", fmt.Errorf("kilnctl key create: no key in %q", out)
	}
	if _, err := kilnctl(ctlBin, env, "credits", "add", "--org", "org_bench", "--usd", "100000", "--json"); err != nil {
		return "", err
	}
	return k.Key, nil
}

// kilnctl runs the operators' CLI with env and returns its standard output.
func kilnctl(ctlBin string, env []string, args ...string) ([]byte, error) {
	cmd := exec.Command(ctlBin, args...)
	cmd.Env = env
	out, err := cmd.Output()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		err = fmt.Errorf("%v\n%s", err, ee.Stderr)
	}
	if err != nil {
		return nil, fmt.Errorf("kilnctl %s: %w", strings.Join(args, " "), err)
	}
	return out, nil
}
