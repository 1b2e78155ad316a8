package gateway

import (
	"context"
	"time"
)

// drain is the gateway's Drain, for at most within.
func (h *harness) drain(within time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	return h.gw.Drain(ctx)
}
