// Package infra carries operator-facing assets that the binaries embed, such as the reference
// model catalog.
package infra

import _ "embed"

// ReferenceCatalog is infra/catalog.yaml, the catalog used when KILN_CATALOG is not set.
//
//go:embed catalog.yaml
var ReferenceCatalog []byte
