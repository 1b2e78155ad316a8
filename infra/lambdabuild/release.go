package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/neocloud/kiln/pkg/catalog"
)

// checkRelease refuses a catalog for a deployment whose backends cannot be reached from Lambda:
// loopback addresses (the reference catalog's simulator on 127.0.0.1) and link-local ones (on
// Lambda 169.254.0.0/16 is the sandbox's own). A stack built with one deploys without complaint and
// then answers every inference with 502, so the build stops instead, naming each backend.
func checkRelease(path string) error {
	if path == "" {
		return errors.New("no catalog: a release needs one (LAMBDA_CATALOG=path/to/catalog.yaml sam build)")
	}
	cat, err := catalog.Load(path)
	if err != nil {
		return fmt.Errorf("catalog %s: %w", path, err)
	}
	var bad []string
	for _, m := range cat.Models {
		for _, b := range m.Backends {
			if why := unreachable(b.URL); why != "" {
				bad = append(bad, fmt.Sprintf("  model %s, backend %s: %s is %s", m.ID, b.Name, b.URL, why))
			}
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("catalog %s has backends a Lambda function cannot reach:\n%s\n"+
			"Give the catalog of your model servers: LAMBDA_CATALOG=path/to/catalog.yaml sam build "+
			"(make build still packages the demo catalog for local use)", path, strings.Join(bad, "\n"))
	}
	return nil
}

// unreachable says why a backend URL names no server a Lambda function can reach, or "".
func unreachable(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "not a URL"
	}
	host := u.Hostname()
	if h := strings.ToLower(strings.TrimSuffix(host, ".")); h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return "a loopback name"
	}
	ip := net.ParseIP(host)
	switch {
	case ip == nil:
		return ""
	case ip.IsLoopback():
		return "a loopback address"
	case ip.IsLinkLocalUnicast():
		return "a link-local address"
	case ip.IsUnspecified():
		return "the unspecified address"
	}
	return ""
}
