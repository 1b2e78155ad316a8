package reliability

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store/sqlite"
	"github.com/neocloud/kiln/pkg/usage"
)

const (
	leavers         = 400 // clients that leave at random points
	leaversAtOnce   = 50
	leaverMaxTokens = 40
)

// TestClientsThatLeave sends 400 streamed and non-streamed requests, 50 at a time, whose
// clients go away at random points: before the answer's headers, after them, after k chunks, or
// never. Every slot comes back; every admitted request has one event and at most one debit;
// nobody is billed less than the chunks they received nor more than the backend generated; the
// ledger equals the events. Then a slow reader (one byte every 50 ms) of a 40 MB answer: the
// gateway's memory stays flat and the backend is held back by the sockets' buffers.
func TestClientsThatLeave(t *testing.T) {
	simURL := startSimulator(t, "sim/plain", "sim/continuous")
	proxy := newFaultProxy(t, strings.TrimSuffix(strings.TrimPrefix(simURL, "http://"), "/v1"))
	dir := t.TempDir()
	st, err := sqlite.Open(filepath.Join(dir, "data"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const org = "org_leavers"
	key := newOrg(t, st, org, leaversAtOnce+10, "100.00")
	gw := startGateway(t,
		"KILN_CATALOG="+writeCatalog(t,
			model{ID: "plain", URL: simURL, Backend: "sim/plain"},
			model{ID: "exact", URL: simURL, Backend: "sim/continuous", Continuous: true},
			model{ID: "slow", URL: proxy.URL(), Backend: "sim/plain"}),
		"KILN_DATA_DIR="+filepath.Join(dir, "data"),
	)

	type outcome struct {
		genID   string
		model   string
		content string
		chunks  int
		whole   bool
	}
	var (
		mu       sync.Mutex
		outcomes []outcome
		statuses = map[int]int{}
	)
	sem := make(chan struct{}, leaversAtOnce)
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range leavers {
		modelID := []string{"plain", "exact"}[rng.IntN(2)]
		stream := rng.IntN(5) != 0
		leaveAfter := rng.IntN(leaverMaxTokens+10) - 5 // <0: before the headers; >= tokens: never
		cancelAfter := time.Duration(rng.IntN(40)) * time.Millisecond
		content := fmt.Sprintf("leaver %d says a few words [[sim:delay_ms=3]]", i)
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if leaveAfter < 0 || !stream {
				time.AfterFunc(cancelAfter, cancel)
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gw.Base+"/chat/completions",
				strings.NewReader(chatBody(modelID, content, stream, leaverMaxTokens)))
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := client.Do(req)
			if err != nil {
				return // left before the headers
			}
			defer resp.Body.Close()
			o := outcome{genID: resp.Header.Get("X-Neocloud-Generation-Id"), model: modelID, content: content}
			mu.Lock()
			statuses[resp.StatusCode]++
			mu.Unlock()
			if resp.StatusCode == 200 && stream {
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
						if d == "[DONE]" {
							o.whole = true
						} else if isContent(d) {
							o.chunks++
							if o.chunks == leaveAfter {
								break
							}
						}
					}
				}
			} else if resp.StatusCode == 200 {
				b, err := io.ReadAll(resp.Body)
				o.whole = err == nil
				if o.whole {
					o.chunks = strings.Count(string(b), "tok")
				}
			}
			mu.Lock()
			outcomes = append(outcomes, o)
			mu.Unlock()
		}()
	}
	wg.Wait()
	waitIdle(t, st, org, 15*time.Second)

	// Every event consistent; every client billed at least what it received.
	events, err := st.Usage(context.Background(), org, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]usage.Event{}
	var sum money.Amount
	counts := map[usage.Status]int{}
	for _, e := range events {
		if _, dup := byID[e.GenerationID]; dup {
			t.Errorf("%s recorded twice", e.GenerationID)
		}
		byID[e.GenerationID] = e
		sum += e.Cost
		counts[e.Status]++
		if e.CompletionTokens > leaverMaxTokens {
			t.Errorf("%s billed %d completion tokens of at most %d generated", e.GenerationID, e.CompletionTokens, leaverMaxTokens)
		}
		if c := cost(t, e.PromptTokens, e.CompletionTokens); e.Cost != c {
			t.Errorf("%s: cost %s for %d + %d tokens, want %s", e.GenerationID, e.Cost, e.PromptTokens, e.CompletionTokens, c)
		}
	}
	for _, o := range outcomes {
		if o.genID == "" {
			continue
		}
		e, ok := byID[o.genID]
		if !ok {
			// 200s have events; a 429 has none.
			if st, err := st.Generation(context.Background(), org, o.genID); err == nil {
				t.Errorf("%s found only later: %v", o.genID, st)
			}
			continue
		}
		if e.CompletionTokens < int64(o.chunks) {
			t.Errorf("%s: the client received %d chunks, billed %d", o.genID, o.chunks, e.CompletionTokens)
		}
		if o.whole && (e.Status != usage.StatusCompleted || e.CompletionTokens != leaverMaxTokens || e.Estimated) {
			t.Errorf("%s: whole answer received, event %s with %d tokens (estimated %v)", o.genID, e.Status, e.CompletionTokens, e.Estimated)
		}
		if !e.Estimated && e.PromptTokens != int64(len(strings.Fields(o.content))) {
			t.Errorf("%s: exact prompt %d, want %d", o.genID, e.PromptTokens, len(strings.Fields(o.content)))
		}
	}
	by, debited := debits(t, st, org)
	for id, d := range by {
		if len(d) != 1 {
			t.Errorf("%s debited %d times", id, len(d))
		}
		if e, ok := byID[id]; !ok || d[0] != -e.Cost {
			t.Errorf("%s debited %v, event %v", id, d, e.Cost)
		}
	}
	if debited != -sum {
		t.Errorf("debits %s, events %s", debited, sum)
	}
	if strings.Contains(gw.stderr.String(), "panic") {
		t.Errorf("the gateway logged a panic")
	}
	t.Logf("%d clients, answers by status %v, %d events by status %v, billed %s = debited %s", leavers, statuses, len(events), counts, sum, -debited)

	slowReader(t, gw, proxy, key)
	waitIdle(t, st, org, 10*time.Second)
}

// slowReader reads a very large streamed answer one byte every 50 ms for 5 s over a raw
// connection and watches the gateway's resident memory and how far the backend got ahead.
func slowReader(t *testing.T, gw *gatewayProc, proxy *faultProxy, key string) {
	const tokens = 200000 // about 45 MB of events
	base := gw.rssBytes(t)
	conn, err := net.Dial("tcp", strings.TrimSuffix(strings.TrimPrefix(gw.Base, "http://"), "/v1"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := chatBody("slow", "read me slowly", true, tokens)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", key, len(body), body)
	before := proxy.answered.Load()
	one := make([]byte, 1)
	var read, maxRSS, aheadMid int64
	start := time.Now()
	for time.Since(start) < 5*time.Second {
		if _, err := io.ReadFull(conn, one); err != nil {
			t.Fatalf("slow read: %v after %d bytes", err, read)
		}
		read++
		if read%5 == 0 {
			maxRSS = max(maxRSS, gw.rssBytes(t))
		}
		if aheadMid == 0 && time.Since(start) > 2500*time.Millisecond {
			aheadMid = proxy.answered.Load() - before
		}
		time.Sleep(50 * time.Millisecond)
	}
	ahead := proxy.answered.Load() - before
	bound := socketBuffers(t)
	t.Logf("slow reader: read %d bytes in 5 s; the backend sent %d bytes by 2.5 s and %d by 5 s (of about %d MB); socket buffer bound %d; gateway RSS %d MiB before, at most %d MiB while reading",
		read, aheadMid, ahead, tokens*230>>20, bound, base>>20, maxRSS>>20)
	if ahead > bound {
		t.Errorf("the backend is %d bytes ahead of a client that read %d, more than the sockets' buffers (%d)", ahead, read, bound)
	}
	if ahead-aheadMid > 1<<20 {
		t.Errorf("the backend kept sending while the client read nothing: %d bytes in the last 2.5 s", ahead-aheadMid)
	}
	if maxRSS-base > 64<<20 {
		t.Errorf("gateway RSS grew from %d MiB to %d MiB under one slow reader", base>>20, maxRSS>>20)
	}
}

// socketBuffers is the most the kernel may buffer on the two loopback connections between the
// backend and the slow client: each connection's send and receive buffers at their maximum.
func socketBuffers(t *testing.T) int64 {
	maxOf := func(path string) int64 {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b))
		n, err := strconv.ParseInt(f[len(f)-1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Two hops (backend → gateway, gateway → client), and the gateway's own read buffer.
	return 2*(maxOf("/proc/sys/net/ipv4/tcp_rmem")+maxOf("/proc/sys/net/ipv4/tcp_wmem")) + 1<<20
}
