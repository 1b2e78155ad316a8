package lambdaserve

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/aws/aws-lambda-go/events"
)

// functionURLRequest builds the http.Request of a function URL invocation (payload format 2.0).
func functionURLRequest(ctx context.Context, ev *events.LambdaFunctionURLRequest) (*http.Request, error) {
	target := cmp.Or(ev.RawPath, "/")
	if ev.RawQueryString != "" {
		target += "?" + ev.RawQueryString
	}
	r, err := newRequest(ctx, ev.RequestContext.HTTP.Method, target, ev.RequestContext.DomainName, ev.Body, ev.IsBase64Encoded)
	if err != nil {
		return nil, err
	}
	for k, v := range ev.Headers {
		r.Header.Add(k, v)
	}
	if len(ev.Cookies) > 0 {
		// Payload 2.0 moves the Cookie header into its own list.
		r.Header.Set("Cookie", strings.Join(ev.Cookies, "; "))
	}
	r.RemoteAddr = ev.RequestContext.HTTP.SourceIP
	return r, nil
}

// restAPIRequest builds the http.Request of an API Gateway REST API proxy invocation (payload
// format 1.0). Path is the resource path the client asked for, without the stage (and without a
// custom domain's base path, which Kiln maps at the root).
func restAPIRequest(ctx context.Context, ev *events.APIGatewayProxyRequest) (*http.Request, error) {
	target := cmp.Or(ev.Path, "/")
	if q := restQuery(ev); q != "" {
		target += "?" + q
	}
	r, err := newRequest(ctx, ev.HTTPMethod, target, ev.RequestContext.DomainName, ev.Body, ev.IsBase64Encoded)
	if err != nil {
		return nil, err
	}
	if len(ev.MultiValueHeaders) > 0 {
		for k, vs := range ev.MultiValueHeaders {
			for _, v := range vs {
				r.Header.Add(k, v)
			}
		}
	} else {
		for k, v := range ev.Headers {
			r.Header.Add(k, v)
		}
	}
	r.RemoteAddr = ev.RequestContext.Identity.SourceIP
	return r, nil
}

// restQuery rebuilds the query string, which payload 1.0 delivers decoded; the multi-valued form
// carries every value of a repeated parameter.
func restQuery(ev *events.APIGatewayProxyRequest) string {
	q := url.Values{}
	if len(ev.MultiValueQueryStringParameters) > 0 {
		for k, vs := range ev.MultiValueQueryStringParameters {
			q[k] = append(q[k], vs...)
		}
	} else {
		for k, v := range ev.QueryStringParameters {
			q.Set(k, v)
		}
	}
	return q.Encode() // sorted by key, each value in its order
}

// newRequest builds a server-side request as net/http would parse it: URL from the request
// target, a body whose length is known (the gateway checks Content-Length against its limit).
func newRequest(ctx context.Context, method, target, host, body string, isBase64 bool) (*http.Request, error) {
	if method == "" {
		return nil, fmt.Errorf("request without a method")
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return nil, fmt.Errorf("request target %q: %w", target, err)
	}
	raw := []byte(body)
	if isBase64 {
		raw, err = base64.StdEncoding.DecodeString(body)
		if err != nil {
			return nil, fmt.Errorf("base64 body: %w", err)
		}
	}
	r, err := http.NewRequestWithContext(ctx, strings.ToUpper(method), target, bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	r.URL = u
	r.RequestURI = target
	r.Host = host
	r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/1.1", 1, 1
	return r, nil
}
