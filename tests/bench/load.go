// Package bench measures what the Kiln gateway adds to a model server: the same load is sent to
// the model simulator directly and through the gateway in the same run, round after round, and
// every figure is reported against that baseline. cmd/kilnbench runs it (`make bench`).
package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// target is one way to reach the model: the simulator directly, or the gateway or the bare proxy
// in front of it.
type target struct {
	name  string // "direct", "gateway" or "bare proxy"
	url   string // the chat completions URL
	key   string // bearer key; "" for the simulator
	model string // the model name this target expects
	// streamOptions is the stream_options object sent when streaming. The simulator is sent
	// what the gateway forwards to it (usage on every chunk), so it does the same work either way.
	streamOptions string
}

// bodies of the three kinds of request.
func (t target) body(kind requestKind) []byte {
	msgs := `"messages":[{"role":"system","content":"Answer briefly."},{"role":"user","content":"Hello there, how are you today?` + kind.directive() + `"}]`
	b := `{"model":"` + t.model + `",` + msgs + fmt.Sprintf(`,"max_tokens":%d`, kind.tokens())
	if kind != nonStreaming {
		b += `,"stream":true,"stream_options":` + t.streamOptions
	}
	return []byte(b + "}")
}

type requestKind int

const (
	nonStreaming requestKind = iota // 16 tokens in one JSON answer
	shortStream                     // 16 tokens, streamed
	longStream                      // 1,000 tokens, streamed
	slowStream                      // 1,000 tokens, one per second: an open, idle stream
)

func (k requestKind) tokens() int {
	if k == longStream || k == slowStream {
		return 1000
	}
	return 16
}

func (k requestKind) directive() string {
	if k == slowStream {
		return " [[sim:delay_ms=1000]]"
	}
	return ""
}

// newClient is an HTTP/1.1 keep-alive client with room for conns connections.
func newClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns:        conns + 16,
		MaxIdleConnsPerHost: conns + 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
}

// result is one request's timings: ttfb is when the first `data:` event (or, not streaming, the
// first body byte) arrived, total when the body ended.
type result struct {
	ttfb, total time.Duration
	chunks      int
}

var errIncomplete = errors.New("stream ended without [DONE]")

// post sends body to t and returns its 200 response; any other status is an error.
func (t target) post(ctx context.Context, c *http.Client, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if t.key != "" {
		req.Header.Set("Authorization", "Bearer "+t.key)
	}
	resp, err := c.Do(req)
	if err == nil && resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	return resp, err
}

// call sends one request and reads the whole answer.
func call(ctx context.Context, c *http.Client, t target, body []byte, stream bool) (result, error) {
	start := time.Now()
	resp, err := t.post(ctx, c, body)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	var r result
	if !stream {
		var one [1]byte
		if _, err := io.ReadFull(resp.Body, one[:]); err != nil {
			return result{}, err
		}
		r.ttfb = time.Since(start)
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return result{}, err
		}
		r.total = time.Since(start)
		return r, nil
	}
	br := bufio.NewReaderSize(resp.Body, 16<<10)
	done := false
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 && bytes.HasPrefix(line, []byte("data: ")) {
			if r.chunks == 0 {
				r.ttfb = time.Since(start)
			}
			r.chunks++
			done = bytes.HasPrefix(line, []byte("data: [DONE]"))
		}
		if err == io.EOF {
			break
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return result{}, err
		}
	}
	r.total = time.Since(start)
	if !done {
		return result{}, errIncomplete
	}
	return r, nil
}

// phase is what one load phase against one target measured.
type phase struct {
	ttfb, total latencies
	chunks      int64
	errs        int64
	firstErr    error
	elapsed     time.Duration            // the measured window
	cpu         map[string]time.Duration // CPU used by each watched process in the window
	syscalls    map[string]int64         // its read and write system calls in the window
	switches    map[string]int64         // its threads' context switches in the window
}

func (p phase) rate() float64 { return float64(len(p.total)) / p.elapsed.Seconds() }

// summary is the phase's p50, p99, rate and errors, for the progress log.
func (p phase) summary() string {
	return fmt.Sprintf("p50 %v p99 %v (%.0f/s, %d errors)", p.total.q(.5), p.total.q(.99), p.rate(), p.errs)
}

// watch names the processes whose CPU a phase accounts.
type watch map[string]int

// read is f of each watched process; a process f cannot read is left out.
func read[V time.Duration | int64](w watch, f func(pid int) (V, error)) map[string]V {
	m := make(map[string]V, len(w))
	for name, pid := range w {
		if v, err := f(pid); err == nil {
			m[name] = v
		}
	}
	return m
}

// since is what each process in w used since before (CPU, or system calls); a process read only
// once is left out, not counted from its start.
func since[V time.Duration | int64](w watch, f func(pid int) (V, error), before map[string]V) map[string]V {
	m := read(w, f)
	for k := range m {
		if b, ok := before[k]; ok {
			m[k] -= b
		} else {
			delete(m, k)
		}
	}
	return m
}

// account runs window and sets the phase's CPU, system calls and context switches to what each
// process in w used meanwhile. The switches, which take the longest to read, are read outside the
// CPU's window.
func (p *phase) account(w watch, window func()) {
	sw0, cpu0, sys0 := read(w, contextSwitches), read(w, processCPU), read(w, syscalls)
	window()
	p.cpu, p.syscalls, p.switches = since(w, processCPU, cpu0), since(w, syscalls, sys0), since(w, contextSwitches, sw0)
	for name := range w {
		if _, ok := p.cpu[name]; !ok {
			p.firstErr = cmp.Or(p.firstErr, fmt.Errorf("%s: its CPU clock could not be read around the phase", name))
		}
	}
}

// add records one request: its timings, or its error.
func (p *phase) add(r result, err error) {
	if err != nil {
		p.errs++
		p.firstErr = cmp.Or(p.firstErr, err)
		return
	}
	p.ttfb, p.total = append(p.ttfb, r.ttfb), append(p.total, r.total)
	p.chunks += int64(r.chunks)
}

// closedLoop runs conns workers, each sending its next request when the last one ended, for
// warmup and then dur; only requests started inside the measured window are recorded.
func closedLoop(t target, kind requestKind, conns int, warmup, dur time.Duration, w watch) phase {
	c := newClient(conns)
	defer c.CloseIdleConnections()
	body := t.body(kind)
	const (
		warming = iota
		measuring
		stopping
	)
	var state atomic.Int32
	var mu sync.Mutex
	var p phase
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			var mine phase // merged once at the end, so that the workers do not contend for mu
			for s := state.Load(); s != stopping; s = state.Load() {
				r, err := call(context.Background(), c, t, body, kind != nonStreaming)
				if s == measuring {
					mine.add(r, err)
				}
			}
			mu.Lock()
			p.ttfb, p.total = append(p.ttfb, mine.ttfb...), append(p.total, mine.total...)
			p.chunks += mine.chunks
			p.errs += mine.errs
			p.firstErr = cmp.Or(p.firstErr, mine.firstErr)
			mu.Unlock()
		})
	}
	time.Sleep(warmup)
	p.account(w, func() {
		t0 := time.Now()
		state.Store(measuring)
		time.Sleep(dur)
		state.Store(stopping)
		p.elapsed = time.Since(t0)
	})
	wg.Wait()
	p.ttfb, p.total = p.ttfb.sorted(), p.total.sorted()
	return p
}

// openLoop sends requests at a fixed rate whatever the answers' pace, and times each from the
// moment it was due, so that a stall shows in the latencies instead of slowing the load.
// Requests that would exceed 2,048 outstanding are counted as errors and not sent.
func openLoop(t target, rate float64, dur time.Duration, w watch) phase {
	c := newClient(512)
	defer c.CloseIdleConnections()
	body := t.body(nonStreaming)
	return paced(rate, dur, 2048, func() error {
		_, err := call(context.Background(), c, t, body, false)
		return err
	}, w)
}

// paced calls send every 1/rate for dur, each call at its due time whatever the answers' pace,
// and records each answer's latency from when it was due (total; ttfb is not measured), and what
// the processes in w used until the last answer; a call that would exceed limit outstanding (0:
// no limit) is counted as an error and not made.
func paced(rate float64, dur time.Duration, limit int64, send func() error, w watch) phase {
	interval := time.Duration(float64(time.Second) / rate)
	var mu sync.Mutex
	var p phase
	var outstanding atomic.Int64
	var wg sync.WaitGroup
	record := func(due time.Time, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			p.add(result{}, err)
		} else {
			p.total = append(p.total, time.Since(due))
		}
	}
	p.account(w, func() {
		start := time.Now()
		for due := start; due.Sub(start) < dur; due = due.Add(interval) {
			time.Sleep(time.Until(due))
			if limit > 0 && outstanding.Load() >= limit {
				record(due, fmt.Errorf("over %d requests outstanding", limit))
				continue
			}
			outstanding.Add(1)
			wg.Go(func() {
				defer outstanding.Add(-1)
				record(due, send())
			})
		}
		wg.Wait()
		p.elapsed = time.Since(start)
	})
	p.total = p.total.sorted()
	return p
}

// openStreams opens n slow streams and returns once each has delivered its first event (or
// after timeout); close cancels them all and waits for their goroutines. At most maxOpening
// requests wait for their answer's headers at once: the figure is what open streams hold, and a
// burst of a thousand admissions at once would meet the gateway's bound on admissions waiting for
// the store (pkg/gateway, maxAdmitting), which refuses the rest with 503.
func openStreams(t target, n int, timeout time.Duration) (opened int, closeAll func(), err error) {
	const maxOpening = 128
	ctx, cancel := context.WithCancel(context.Background())
	c := newClient(n)
	body := t.body(slowStream)
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	opening := make(chan struct{}, maxOpening)
	for range n {
		wg.Go(func() {
			opening <- struct{}{}
			resp, err := t.post(ctx, c, body)
			<-opening
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
				return
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			for {
				line, err := br.ReadSlice('\n')
				if bytes.HasPrefix(line, []byte("data: ")) {
					ok.Add(1)
					break
				}
				if err != nil {
					failed.Add(1)
					return
				}
			}
			_, _ = io.Copy(io.Discard, br) // hold the stream open until cancelled
		})
	}
	deadline := time.Now().Add(timeout)
	for ok.Load()+failed.Load() < int64(n) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if e, _ := firstErr.Load().(error); e != nil {
		err = e
	}
	return int(ok.Load()), func() {
		cancel()
		wg.Wait()
		c.CloseIdleConnections()
	}, err
}
