// Command bareproxy is the least a Go net/http proxy can do in the gateway's place: an
// httputil.ReverseProxy in front of one model server, with no authentication, no store and no look
// at the body, so that the benchmark can tell how much of the gateway's added latency any Go
// proxy adds on the same machine. It prints "listening on http://ADDR/v1" once it accepts
// connections; requests keep their path, so the client sends what it would send the model server.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"sync"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bareproxy:", err)
		os.Exit(1)
	}
}

func run() error {
	upstream := flag.String("upstream", "", "the model server, http://HOST:PORT")
	flag.Parse()
	u, err := url.Parse(*upstream)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return fmt.Errorf("-upstream: want http://HOST:PORT, got %q", *upstream)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(u) },
		// Every write reaches the client at once, as the gateway relays streams.
		FlushInterval: -1,
		Transport: &http.Transport{
			DialContext:  (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns: 1024,
			// Above the benchmark's 64 connections and open-loop bursts, so that no request
			// waits for a connection to the model server to be dialled.
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
		// Without a pool each request allocates a 32 KiB copy buffer; any proxy tuned for
		// throughput reuses them. An open stream holds its buffer while it waits, so they are
		// the size the gateway reads a backend with, 4 KiB; larger events are copied in pieces.
		BufferPool: &bufferPool{},
	}
	fmt.Printf("listening on http://%s/v1\n", ln.Addr())
	// Full duplex: a model server that streams sends its headers before the Transport has
	// checked that the request body ended, and the HTTP/1 server, on writing those headers,
	// closes a body that is not declared full duplex, which makes the Transport drop the
	// connection in the middle of the answer (golang/go#40747): one stream in about twenty-five
	// through this proxy failed so.
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		proxy.ServeHTTP(w, r)
	})
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// bufferPool is httputil.BufferPool over a sync.Pool of 4 KiB buffers.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if buf, ok := b.p.Get().(*[]byte); ok {
		return *buf
	}
	return make([]byte, 4<<10)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }
