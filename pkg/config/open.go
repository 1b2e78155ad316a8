package config

import (
	"context"
	"fmt"

	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/sqlite"
)

// OpenStore opens the store the configuration names.
func OpenStore(ctx context.Context, c Config) (store.Store, error) {
	switch c.Store {
	case StoreSQLite:
		s, err := sqlite.Open(c.DataDir)
		if err != nil {
			return nil, fmt.Errorf("open embedded store in %s: %w", c.DataDir, err)
		}
		return s, nil
	case StoreDynamoDB:
		return nil, fmt.Errorf("KILN_STORE=dynamodb: the DynamoDB store is not part of this build yet")
	}
	return nil, fmt.Errorf("KILN_STORE=%q: unknown store", c.Store)
}
