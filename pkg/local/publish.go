package local

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/neocloud/kiln/pkg/config"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
	"github.com/neocloud/kiln/pkg/usage/eventbridge"
	"github.com/neocloud/kiln/pkg/usage/publish"
)

// NewPublisher wires the publishing of usage events on st's outbox: to the EventBridge bus
// KILN_EVENT_BUS names (at KILN_EVENTBRIDGE_ENDPOINT when set), or, without a bus, to the
// in-process bus, which folds each event into st's own aggregates with the aggregator's fold.
// When the store folds at settlement (config.FoldsAtSettlement), the gateway publishes nothing
// and this publisher only sweeps what an earlier run left in the outbox.
func NewPublisher(ctx context.Context, cfg config.Config, st store.Store, log *slog.Logger) (*publish.Publisher, error) {
	opt := publish.Options{Outbox: st, Log: log, SweepEvery: cfg.UsageSweep}
	if cfg.EventBus != "" {
		eb, err := eventbridge.Open(ctx, eventbridge.Config{Bus: cfg.EventBus, Endpoint: cfg.EventBridgeURL, Region: cfg.Region})
		if err != nil {
			return nil, fmt.Errorf("usage events: %w", err)
		}
		opt.Sender = eb
		log.Info("usage events go to EventBridge", slog.String("bus", cfg.EventBus))
	} else {
		opt.Sender = publish.InProcess{Recorder: usage.NewAggregator(st)}
		how := "by the in-process bus"
		if cfg.FoldsAtSettlement() {
			how = "as they are settled"
		}
		log.Info("usage events are aggregated in-process (KILN_EVENT_BUS is not set)", slog.String("folded", how))
	}
	return publish.New(opt)
}
