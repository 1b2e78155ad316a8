package lambdaserve

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
)

func urlEvent(method, rawPath, query, body string) json.RawMessage {
	b, _ := json.Marshal(events.LambdaFunctionURLRequest{
		Version: "2.0", RawPath: rawPath, RawQueryString: query, Body: body,
		Headers: map[string]string{"authorization": "Bearer k", "x-multi": "a"},
		Cookies: []string{"a=1", "b=2"},
		RequestContext: events.LambdaFunctionURLRequestContext{
			DomainName: "x.lambda-url.us-east-1.on.aws",
			HTTP:       events.LambdaFunctionURLRequestContextHTTPDescription{Method: method, SourceIP: "203.0.113.7"},
		},
	})
	return b
}

func restEvent(method, path string, query map[string][]string, body string) json.RawMessage {
	b, _ := json.Marshal(events.APIGatewayProxyRequest{
		HTTPMethod: method, Path: path, Body: body, MultiValueQueryStringParameters: query,
		MultiValueHeaders: map[string][]string{"Authorization": {"Bearer k"}, "X-Multi": {"a", "b"}},
		RequestContext:    events.APIGatewayProxyRequestContext{DomainName: "api.example.com", Identity: events.APIGatewayRequestIdentity{SourceIP: "203.0.113.7"}},
	})
	return b
}

// echo answers with what it was asked, in two flushed writes, with a repeated header.
var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Add("X-Twice", "1")
	w.Header().Add("X-Twice", "2")
	w.Header().Set("Content-Length", "999")
	w.WriteHeader(http.StatusTeapot)
	_, _ = io.WriteString(w, r.Method+" "+r.URL.RequestURI()+" "+r.Host+"\n")
	if err := http.NewResponseController(w).Flush(); err != nil {
		panic("flush not supported: " + err.Error())
	}
	_, _ = io.WriteString(w, strings.Join([]string{r.Header.Get("Authorization"), r.Header.Get("Cookie"), r.RemoteAddr, string(body), r.Header.Get("Content-Length")}, "|"))
})

func TestFunctionURL(t *testing.T) {
	out, err := New(echo, nil).Invoke(context.Background(), urlEvent("POST", "/v1/x", "a=1&b=%20", "hello"))
	if err != nil {
		t.Fatal(err)
	}
	resp, ok := out.(*events.LambdaFunctionURLStreamingResponse)
	if !ok {
		t.Fatalf("response %T, want *events.LambdaFunctionURLStreamingResponse", out)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusTeapot || resp.Headers["X-Twice"] != "1, 2" || resp.Headers["Content-Length"] != "" {
		t.Errorf("head %d %v", resp.StatusCode, resp.Headers)
	}
	want := "POST /v1/x?a=1&b=%20 x.lambda-url.us-east-1.on.aws\nBearer k|a=1; b=2|203.0.113.7|hello|"
	if string(body) != want {
		t.Errorf("body %q\nwant %q", body, want)
	}
}

func TestRESTAPI(t *testing.T) {
	out, err := New(echo, nil).Invoke(context.Background(), restEvent("GET", "/v1/generation", map[string][]string{"id": {"gen-1"}, "z": {"a b", "c"}}, ""))
	if err != nil {
		t.Fatal(err)
	}
	resp, ok := out.(*events.APIGatewayProxyStreamingResponse)
	if !ok {
		t.Fatalf("response %T, want *events.APIGatewayProxyStreamingResponse", out)
	}
	raw, _ := io.ReadAll(resp) // the whole integration response: prelude, 8 NULs, body
	head, body, found := strings.Cut(string(raw), "\x00\x00\x00\x00\x00\x00\x00\x00")
	if !found || !strings.Contains(head, `"statusCode":418`) || !strings.Contains(head, `"X-Twice":["1","2"]`) {
		t.Fatalf("integration response %q", raw)
	}
	if want := "GET /v1/generation?id=gen-1&z=a+b&z=c api.example.com\nBearer k||203.0.113.7||"; body != want {
		t.Errorf("body %q\nwant %q", body, want)
	}
}

func TestUnknownEvent(t *testing.T) {
	if _, err := New(echo, nil).Invoke(context.Background(), json.RawMessage(`{"Records":[]}`)); err != ErrUnknownEvent {
		t.Errorf("err %v, want ErrUnknownEvent", err)
	}
}

func TestDefaultStatus(t *testing.T) {
	out, err := New(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), nil).Invoke(context.Background(), urlEvent("GET", "/", "", ""))
	if err != nil {
		t.Fatal(err)
	}
	if s := out.(*events.LambdaFunctionURLStreamingResponse).StatusCode; s != http.StatusOK {
		t.Errorf("status %d, want 200 from a handler that wrote nothing", s)
	}
}

func TestPanic(t *testing.T) {
	before := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") })
	if _, err := New(before, nil).Invoke(context.Background(), urlEvent("GET", "/", "", "")); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("panic before the head: err %v, want the invocation to fail", err)
	}
	after := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "partial")
		panic("boom")
	})
	out, err := New(after, nil).Invoke(context.Background(), urlEvent("GET", "/", "", ""))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(out.(*events.LambdaFunctionURLStreamingResponse).Body)
	if string(body) != "partial" || err == nil {
		t.Errorf("panic after the head: body %q, err %v; want the partial body and an error", body, err)
	}
}

func TestBadTarget(t *testing.T) {
	out, err := New(echo, nil).Invoke(context.Background(), urlEvent("GET", "relative", "", ""))
	if err != nil {
		t.Fatal(err)
	}
	if s := out.(*events.LambdaFunctionURLStreamingResponse).StatusCode; s != http.StatusBadRequest {
		t.Errorf("status %d, want 400", s)
	}
}
