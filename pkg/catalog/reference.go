package catalog

import (
	"bytes"
	_ "embed"
)

// referenceYAML is the reference catalog. infra/catalog.yaml, where operators and the build
// tooling (make customer-docs, lambdabuild, the benchmark) find it, links to this file.
//
//go:embed reference.yaml
var referenceYAML []byte

// ReferenceSimulator is the address the reference catalog's backends name: the built-in model
// simulator's, as `make run` starts it by default.
const ReferenceSimulator = "127.0.0.1:8090"

// ReferenceYAML returns the reference catalog's file, the gateway's catalog when KILN_CATALOG is
// not set.
func ReferenceYAML() []byte { return append([]byte(nil), referenceYAML...) }

// Reference returns the reference catalog with its backends on the model simulator at simulator
// (host:port) instead of ReferenceSimulator, so that the catalog follows a simulator started
// elsewhere; "" keeps the file's addresses.
func Reference(simulator string) (*Catalog, error) {
	if simulator == "" {
		return Parse(referenceYAML)
	}
	return Parse(bytes.ReplaceAll(referenceYAML, []byte("//"+ReferenceSimulator+"/"), []byte("//"+simulator+"/")))
}
