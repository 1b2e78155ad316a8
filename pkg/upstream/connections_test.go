package upstream

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/catalog"
)

// countingConns is a test server that counts the connections it accepted and has open.
type countingConns struct {
	*httptest.Server
	opened, open atomic.Int64
}

func newCountingServer(t *testing.T, h http.HandlerFunc) *countingConns {
	s := &countingConns{Server: httptest.NewUnstartedServer(h)}
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			s.opened.Add(1)
			s.open.Add(1)
		case http.StateClosed, http.StateHijacked:
			s.open.Add(-1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func onePool(t *testing.T, url string) (*Pool, *catalog.Model, *http.Transport) {
	t.Helper()
	c := model(catalog.Backend{Name: "b", URL: url})
	p := New(c, Options{})
	return p, c.Models[0], p.backends["b"].transport
}

// eventually polls cond for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s: %s", what)
		}
	}
}

// TestConnectionsAreKeptAlive: answers read to their end, and streams left at their [DONE] event,
// leave the connection to the next request; a body closed in the middle of a stream closes it,
// and the backend sees its request end.
func TestConnectionsAreKeptAlive(t *testing.T) {
	gone := make(chan struct{}, 1)
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/v1/json":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"got":%q}`, b)
		case "/v1/len":
			fmt.Fprint(w, len(b))
		case "/v1/stream":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
			w.(http.Flusher).Flush()
			time.Sleep(5 * time.Millisecond) // the chunked encoding's end comes after the relay stopped reading
		case "/v1/endless":
			w.Header().Set("Content-Type", "text/event-stream")
			for {
				if _, err := io.WriteString(w, "data: {}\n\n"); err != nil {
					gone <- struct{}{}
					return
				}
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					gone <- struct{}{}
					return
				case <-time.After(time.Millisecond):
				}
			}
		}
	})
	p, m, _ := onePool(t, srv.URL+"/v1")
	ctx := context.Background()
	for i := range 20 {
		resp, err := p.Do(ctx, Call{Model: m, Path: "/json", Body: func(catalog.Backend) []byte { return []byte(fmt.Sprint(i)) }, OrgID: "org_a"})
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf(`{"got":"%d"}`, i); err != nil || string(b) != want {
			t.Fatalf("request %d: %q, %v; want %s", i, b, err, want)
		}
	}
	if n := srv.opened.Load(); n != 1 {
		t.Fatalf("20 requests one after the other opened %d connections, want 1", n)
	}
	// Requests too large to be written before their answer is read keep the connection too.
	large := make([]byte, 100<<10)
	for range 30 {
		resp, err := p.Do(ctx, Call{Model: m, Path: "/len", Body: func(catalog.Backend) []byte { return large }, OrgID: "org_a"})
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil || string(b) != fmt.Sprint(len(large)) {
			t.Fatalf("%q, %v", b, err)
		}
		if n, err := resp.Body.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("a read after the end: %d, %v; want io.EOF", n, err)
		}
		resp.Body.Close()
	}
	if n := srv.opened.Load(); n != 1 {
		t.Fatalf("large requests one after the other opened %d connections in all, want 1", n)
	}

	for range 3 {
		resp, err := p.Do(ctx, Call{Model: m, Path: "/stream", Body: body, OrgID: "org_a"})
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("stream ended before [DONE]: %v", err)
			}
			if line == "data: [DONE]\n" {
				break
			}
		}
		resp.Body.Close()
	}
	if n := srv.opened.Load(); n != 1 {
		t.Fatalf("streams closed at [DONE] opened %d connections, want 1", n)
	}

	resp, err := p.Do(ctx, Call{Model: m, Path: "/endless", Body: body, OrgID: "org_a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resp.Body.Read(make([]byte, 64)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp.Body.Close()
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatal("a stream closed in its middle went on at the backend")
	}
	if d := time.Since(start); d > drainFor+time.Second {
		t.Errorf("the backend saw the request end %v after the body was closed", d)
	}
	eventually(t, "the cut stream's connection is still open", func() bool { return srv.open.Load() == 0 })
	if _, err := resp.Body.Read(make([]byte, 1)); err != http.ErrBodyReadAfterClose {
		t.Errorf("read after close: %v", err)
	}
}

// rawServer answers each connection's requests with answer, then closes the connection if it
// says so; it reports each connection it accepted on accepted.
func rawServer(t *testing.T, answer func(n int, req *http.Request) (reply string, closeAfter bool)) (url string, accepted chan int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = make(chan int, 100)
	go func() {
		for n := 0; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- n
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					reply, closeAfter := answer(n, req)
					if _, err := io.WriteString(c, reply); err != nil || closeAfter {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/v1", accepted
}

const okReply = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"

func doOK(t *testing.T, p *Pool, m *catalog.Model) {
	t.Helper()
	resp, err := p.Do(context.Background(), Call{Model: m, Path: "/x", Body: body, OrgID: "org_a"})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, err := io.ReadAll(resp.Body); err != nil || resp.StatusCode != 200 || string(b) != "{}" {
		t.Fatalf("%d %q %v", resp.StatusCode, b, err)
	}
}

// TestConnectionClosedByTheBackendIsNotReused: a backend that closes a kept-alive connection
// after answering (as servers do when their idle timeout ends) costs the next request nothing: the
// connection leaves the pool when the backend closes it, before a request is written to it.
func TestConnectionClosedByTheBackendIsNotReused(t *testing.T) {
	closed := make(chan struct{}, 10)
	url, accepted := rawServer(t, func(int, *http.Request) (string, bool) {
		defer func() { closed <- struct{}{} }()
		return okReply, true
	})
	p, m, _ := onePool(t, url)
	for range 3 {
		doOK(t, p, m)
		<-closed
		<-accepted
		time.Sleep(10 * time.Millisecond) // the backend's FIN crosses the loopback
	}
	if n := len(accepted); n != 0 {
		t.Errorf("%d connections more than requests", n)
	}
}

// TestInterimAnswersAreSkipped: a 100 Continue before the answer is not the answer.
func TestInterimAnswersAreSkipped(t *testing.T) {
	url, _ := rawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 100 Continue\r\n\r\n" + okReply, false
	})
	p, m, _ := onePool(t, url)
	doOK(t, p, m)
	doOK(t, p, m)
}

// TestBytesAfterTheAnswerCloseTheConnection: bytes that follow an answer belong to no request; the
// connection they came on is not used again.
func TestBytesAfterTheAnswerCloseTheConnection(t *testing.T) {
	url, accepted := rawServer(t, func(int, *http.Request) (string, bool) {
		return okReply + okReply, false
	})
	p, m, _ := onePool(t, url)
	doOK(t, p, m)
	doOK(t, p, m)
	if n := len(accepted); n != 2 {
		t.Errorf("%d connections for two requests, want 2", n)
	}
}

// TestIdleConnectionsAreClosed: a connection idle for longer than the pool keeps one is closed,
// before the backend closes it under a request.
func TestIdleConnectionsAreClosed(t *testing.T) {
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "{}") })
	p, m, tr := onePool(t, srv.URL+"/v1")
	tr.IdleConnTimeout = 50 * time.Millisecond
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { doOK(t, p, m) })
	}
	wg.Wait()
	if srv.open.Load() == 0 {
		t.Fatal("no connection kept")
	}
	eventually(t, "idle connections are still open", func() bool { return srv.open.Load() == 0 })
	doOK(t, p, m) // the pool starts over
	eventually(t, "the new idle connection is still open", func() bool { return srv.open.Load() == 0 })
}

// TestConcurrentRequests: requests at once, streams cut and whole, each get their own answer; run
// with -race.
func TestConcurrentRequests(t *testing.T) {
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		for i := range 3 {
			fmt.Fprintf(w, "%s.%d\n", b, i)
			w.(http.Flusher).Flush()
		}
	})
	p, m, _ := onePool(t, srv.URL+"/v1")
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 30 {
				id := fmt.Sprintf("%d-%d", g, i)
				resp, err := p.Do(context.Background(), Call{Model: m, Path: "/x", Body: func(catalog.Backend) []byte { return []byte(id) }, OrgID: "org_a"})
				if err != nil {
					t.Error(err)
					return
				}
				line, err := bufio.NewReader(resp.Body).ReadString('\n')
				if err != nil || line != id+".0\n" {
					t.Errorf("%s: %q, %v", id, line, err)
				}
				if i%3 == 0 {
					_, _ = io.Copy(io.Discard, resp.Body)
				}
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	if n := srv.opened.Load(); n > 100 {
		t.Errorf("%d connections for 480 requests from 16 goroutines", n)
	}
}

// TestHTTPSBackendsUseTheTransport: a backend on https:// is sent through net/http's transport, for
// TLS and HTTP/2.
func TestHTTPSBackendsUseTheTransport(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s", r.Proto, r.URL.Path, b)
	}))
	defer srv.Close()
	c := model(catalog.Backend{Name: "b", URL: srv.URL + "/v1"})
	p := New(c, Options{})
	be := p.backends["b"]
	be.transport.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig
	resp, err := p.Do(context.Background(), Call{Model: c.Models[0], Path: "/x", Body: body, OrgID: "org_a"})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); !strings.HasSuffix(string(b), ` /v1/x {"model":"m"}`) {
		t.Errorf("got %q", b)
	}
}

// TestHTTP2IsKept: an https:// backend that offers HTTP/2 is spoken to in HTTP/2, which names every
// answer's stream, and its connection is not wrapped.
func TestHTTP2IsKept(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, r.Proto)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	p, m, tr := onePool(t, srv.URL+"/v1")
	tr.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig
	for range 2 {
		resp, err := p.Do(context.Background(), Call{Model: m, Path: "/x", Body: body, OrgID: "org_a"})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "HTTP/2.0" || resp.TLS == nil {
			t.Fatalf("the backend saw %q (TLS state %v), want HTTP/2.0", b, resp.TLS != nil)
		}
	}
}

// TestEarlyAnswerToALargeBody: a backend that answers before it read a large body (a limit of its
// own) is heard: its answer reaches the caller, it is not counted as failing, and its connection
// is not reused. Neither when it closes the connection, nor when it keeps it open without reading.
func TestEarlyAnswerToALargeBody(t *testing.T) {
	for _, keepOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep open %v", keepOpen), func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			var accepted atomic.Int64
			release := make(chan struct{})
			defer close(release)
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					accepted.Add(1)
					go func() {
						defer c.Close()
						br := bufio.NewReader(c)
						if _, err := http.ReadRequest(br); err != nil {
							return
						}
						io.WriteString(c, "HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 9\r\n\r\ntoo large")
						if keepOpen {
							<-release
						}
					}()
				}
			}()
			c := model(catalog.Backend{Name: "b", URL: "http://" + ln.Addr().String() + "/v1"})
			p := New(c, Options{HeaderTimeout: 10 * time.Second, FailureThreshold: 2})
			big := make([]byte, 16<<20)
			for range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := p.Do(ctx, Call{Model: c.Models[0], Path: "/x", Body: func(catalog.Backend) []byte { return big }, OrgID: "org_a"})
				if err != nil {
					cancel()
					t.Fatalf("the backend's early answer was lost: %v", err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				cancel()
				if resp.StatusCode != 413 || string(b) != "too large" {
					t.Fatalf("%d %q", resp.StatusCode, b)
				}
			}
			if !p.healthy("b", time.Now()) {
				t.Error("a backend that answered 413 is marked unhealthy")
			}
			if n := accepted.Load(); n != 3 {
				t.Errorf("%d connections for 3 requests not read whole: one was reused", n)
			}
		})
	}
}

// TestLeftCallerSendsNothing: a caller whose context has ended before the request leaves sends
// nothing, and costs no pooled connection.
func TestLeftCallerSendsNothing(t *testing.T) {
	var hits atomic.Int64
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1); io.WriteString(w, "{}") })
	p, m, _ := onePool(t, srv.URL+"/v1")
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { doOK(t, p, m) })
	}
	wg.Wait()
	opened, open, before := srv.opened.Load(), srv.open.Load(), hits.Load()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 50 {
		if _, err := p.Do(ctx, Call{Model: m, Path: "/x", Body: body, OrgID: "org_a"}); !errors.Is(err, context.Canceled) {
			t.Fatalf("want context.Canceled, got %v", err)
		}
	}
	if n := hits.Load() - before; n != 0 {
		t.Errorf("%d requests of a caller that had left reached the backend", n)
	}
	if n, m := srv.opened.Load(), srv.open.Load(); n != opened || m != open {
		t.Errorf("%d connections opened and %d open, %d and %d before", n, m, opened, open)
	}
}

// TestOversizedHeadersAreRefused: a backend's header lines are read up to 1 MiB, not without end.
func TestOversizedHeadersAreRefused(t *testing.T) {
	url, _ := rawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("x", 2<<20) + "\r\nContent-Length: 2\r\n\r\n{}", true
	})
	p, m, _ := onePool(t, url)
	var ue *Error
	if _, err := p.Do(context.Background(), Call{Model: m, Path: "/x", Body: body, OrgID: "org_a"}); !errors.As(err, &ue) || !strings.Contains(err.Error(), "headers exceeded") {
		t.Fatalf("want the response headers refused, got %v", err)
	}
	url, _ = rawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nX-Fine: " + strings.Repeat("x", 64<<10) + "\r\nContent-Length: 2\r\n\r\n{}", true
	})
	p, m, _ = onePool(t, url)
	doOK(t, p, m)
}

// TestCloseDuringRead: closing a body while another goroutine reads it ends the read, with the
// caller's context error when that is why; the connection is not pooled.
func TestCloseDuringRead(t *testing.T) {
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	p, m, _ := onePool(t, srv.URL+"/v1")
	for _, byCancel := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		resp, err := p.Do(ctx, Call{Model: m, Path: "/x", Body: body, OrgID: "org_a"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := resp.Body.Read(make([]byte, 64)); err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			_, err := resp.Body.Read(make([]byte, 64))
			got <- err
		}()
		time.Sleep(20 * time.Millisecond) // the read waits
		if byCancel {
			cancel()
		} else {
			resp.Body.Close()
		}
		select {
		case err := <-got:
			if err == nil || (byCancel && !errors.Is(err, context.Canceled)) {
				t.Errorf("cancelled %v: the read ended with %v", byCancel, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("cancelled %v: the read goes on", byCancel)
		}
		resp.Body.Close()
		cancel()
	}
	eventually(t, "the streams' connections are still open", func() bool { return srv.open.Load() == 0 })
}

// TestNoRequestIsHandedAnothersAnswer: a backend that follows every answer with a second one (a
// duplicate, a bug, a hostile server) never makes a request of one organization read what was
// written for another: each request reads its own answer or, failing that, an error. Two
// organizations share one backend's connections, request after request, so that a connection
// one has finished with is taken at once by the other. Over http://, and over https:// without
// HTTP/2.
func TestNoRequestIsHandedAnothersAnswer(t *testing.T) {
	t.Run("http", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p, m, _ := onePool(t, "http://"+ln.Addr().String()+"/v1")
		noAnotherAnswer(t, ln, p, m, 300)
	})
	t.Run("https", func(t *testing.T) {
		srv := httptest.NewUnstartedServer(nil)
		srv.StartTLS() // for its certificate and a client that trusts it
		srv.Close()
		ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: srv.TLS.Certificates, NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		p, m, tr := onePool(t, "https://"+ln.Addr().String()+"/v1")
		tr.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig
		noAnotherAnswer(t, ln, p, m, 100) // fewer: most requests shake hands anew
	})
}

// noAnotherAnswer serves on ln a backend that follows each answer with another in the same write
// (so that it arrives in the same read as the end of the first), and checks that each organization's
// requests through p, each of the two sending each, read their own.
func noAnotherAnswer(t *testing.T, ln net.Listener, p *Pool, m *catalog.Model, each int) {
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					who, _ := io.ReadAll(req.Body)
					answer := func(s string) string {
						return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(s), s)
					}
					if _, err := io.WriteString(c, answer(string(who))+answer("extra for "+string(who))); err != nil {
						return
					}
				}
			}()
		}
	}()
	var wg sync.WaitGroup
	var answered atomic.Int64
	for _, org := range []string{"org_a", "org_b"} {
		wg.Go(func() {
			for i := range each {
				who := fmt.Sprintf("%s/%d", org, i)
				resp, err := p.Do(context.Background(), Call{Model: m, Path: "/x", Body: func(catalog.Backend) []byte { return []byte(who) }, OrgID: org})
				if err != nil {
					continue // an error is safe; another's answer is not
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err == nil && string(b) != who {
					t.Errorf("%s read %q", who, b)
				}
				answered.Add(1)
			}
		})
	}
	wg.Wait()
	if n := answered.Load(); n != int64(2*each) {
		t.Errorf("%d of %d requests answered: nothing of the others reached the backend, they could have been sent again", n, 2*each)
	}
}

// TestAnswerNamingAnotherRequestIsRefused: each request carries an X-Request-Id, and an answer
// that echoes another request's id (here a duplicate of the first answer, which the backend sends
// only once the second request has arrived, so that no look at the connection can tell it from
// the second's answer) is refused: the second request gets an error, never the first's bytes, and
// the connection goes; the next request is answered on a new one.
func TestAnswerNamingAnotherRequestIsRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				var last string // the previous answer on this connection
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					who, _ := io.ReadAll(req.Body)
					answer := fmt.Sprintf("HTTP/1.1 200 OK\r\nX-Request-Id: %s\r\nContent-Length: %d\r\n\r\n%s", req.Header.Get("X-Request-Id"), len(who), who)
					if _, err := io.WriteString(c, last+answer); err != nil {
						return
					}
					last = answer
				}
			}()
		}
	}()
	p, m, _ := onePool(t, "http://"+ln.Addr().String()+"/v1")
	do := func(who string) (string, error) {
		resp, err := p.Do(context.Background(), Call{Model: m, Path: "/x", Body: func(catalog.Backend) []byte { return []byte(who) }, OrgID: who})
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	if got, err := do("org_a"); err != nil || got != "org_a" {
		t.Fatalf("the first request read %q, %v", got, err)
	}
	got, err := do("org_b")
	var ue *Error
	if !errors.As(err, &ue) || !errors.Is(err, errAnotherAnswer) {
		t.Fatalf("the second request read %q, %v; want the backend's error", got, err)
	}
	if got, err := do("org_c"); err != nil || got != "org_c" {
		t.Fatalf("the third request read %q, %v", got, err)
	}
	if n := accepted.Load(); n != 2 {
		t.Errorf("%d connections, want 2: the one that carried another's answer was reused", n)
	}
}

// TestRequestIDsOfOthersAreNotChecked: an answer whose X-Request-Id is not one of the pool's (a
// proxy in front of the backend stamps its own) cannot be checked, and is taken; the request
// carried an id of the pool's.
func TestRequestIDsOfOthersAreNotChecked(t *testing.T) {
	sent := make(chan string, 1)
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		sent <- r.Header.Get("X-Request-Id")
		w.Header().Set("X-Request-Id", "3f2c9a50-proxy")
		io.WriteString(w, "{}")
	})
	p, m, _ := onePool(t, srv.URL+"/v1")
	doOK(t, p, m)
	if id := <-sent; !strings.HasPrefix(id, requestIDPrefix) || len(id) < len(requestIDPrefix)+20 {
		t.Errorf("the request carried X-Request-Id %q, want a random id of the pool's", id)
	}
}

// TestBackendsThatEchoIDsMustNameTheirAnswers: for a backend the catalog says echoes X-Request-Id
// (echoes_request_id), an answer without the request's own id is refused as the backend's error,
// be it without the header or with an id a proxy stamped; with its id it is taken.
func TestBackendsThatEchoIDsMustNameTheirAnswers(t *testing.T) {
	for _, tc := range []struct {
		name string
		echo func(id string) string // the id answered; "" sends no header
		ok   bool
	}{
		{"its own id", func(id string) string { return id }, true},
		{"no id", func(string) string { return "" }, false},
		{"a proxy's id", func(string) string { return "3f2c9a50-proxy" }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
				if id := tc.echo(r.Header.Get("X-Request-Id")); id != "" {
					w.Header().Set("X-Request-Id", id)
				}
				io.WriteString(w, "{}")
			})
			c := model(catalog.Backend{Name: "b", URL: srv.URL + "/v1", EchoesRequestID: true})
			p := New(c, Options{})
			resp, err := p.Do(context.Background(), Call{Model: c.Models[0], Path: "/x", Body: body, OrgID: "org_a"})
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return
			}
			var ue *Error
			if !errors.As(err, &ue) || !errors.Is(err, errAnotherAnswer) {
				t.Fatalf("answer taken (%v); want the backend's error", err)
			}
		})
	}
}
