// Package eventbridge publishes usage events to an Amazon EventBridge bus with PutEvents: source
// kiln.gateway, detail-type usage.recorded, the event's JSON as the detail (contract section 8).
package eventbridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"

	"github.com/neocloud/kiln/pkg/usage"
)

// The envelope fields of every entry; pkg/ingest checks the same on the way out of SQS.
const (
	Source     = "kiln.gateway"
	DetailType = "usage.recorded"
)

// MaxEntries is the most entries one PutEvents call takes.
const MaxEntries = 10

// Config says where the bus is.
type Config struct {
	Bus      string // the bus name (KILN_EVENT_BUS)
	Endpoint string // KILN_EVENTBRIDGE_ENDPOINT: a local server (moto); empty means AWS
	Region   string // empty means the SDK's default, or us-east-1 with an Endpoint
	// Attempts bounds the tries of each entry (calls that fail, entries the bus refuses);
	// zero means 5. Backoff is the first pause between tries, doubled each time up to 2 s;
	// zero means 100 ms.
	Attempts int
	Backoff  time.Duration
}

// putEvents is the one call the publisher makes; tests put faults in front of it.
type putEvents interface {
	PutEvents(ctx context.Context, in *eventbridge.PutEventsInput, opts ...func(*eventbridge.Options)) (*eventbridge.PutEventsOutput, error)
}

// Publisher sends usage events to one bus.
type Publisher struct {
	api      putEvents
	bus      string
	attempts int
	backoff  time.Duration
}

// Open builds an EventBridge client from the SDK's usual configuration and returns a publisher
// on cfg.Bus. With a loopback Endpoint it uses fixed local credentials. The SDK's own retries are off: Publish retries
// whole calls and refused entries alike, with its own backoff.
func Open(ctx context.Context, cfg Config) (*Publisher, error) {
	if cfg.Bus == "" {
		return nil, errors.New("eventbridge: no bus name")
	}
	var opts []func(*awsconfig.LoadOptions) error
	if cfg.Region != "" {
		opts = append(opts, awsconfig.WithRegion(cfg.Region))
	}
	if cfg.Endpoint != "" {
		u, err := url.Parse(cfg.Endpoint)
		if err != nil || u.Scheme == "" || u.Host == "" {
			return nil, fmt.Errorf("eventbridge endpoint %q: want a URL such as http://127.0.0.1:5000", cfg.Endpoint)
		}
		if cfg.Region == "" {
			opts = append(opts, awsconfig.WithRegion("us-east-1"))
		}
		if isLoopback(u.Hostname()) {
			opts = append(opts, awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("kilnlocal", "kilnlocal", "")))
		}
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("eventbridge: %w", err)
	}
	client := eventbridge.NewFromConfig(awsCfg, func(o *eventbridge.Options) {
		o.RetryMaxAttempts = 1
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
	})
	return New(client, cfg), nil
}

// New returns a publisher that calls api.
func New(api putEvents, cfg Config) *Publisher {
	p := &Publisher{api: api, bus: cfg.Bus, attempts: cfg.Attempts, backoff: cfg.Backoff}
	if p.attempts <= 0 {
		p.attempts = 5
	}
	if p.backoff <= 0 {
		p.backoff = 100 * time.Millisecond
	}
	return p
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Publish sends events in PutEvents calls of at most MaxEntries entries. Entries the bus refuses
// (FailedEntryCount, an ErrorCode on the entry) and calls that fail are tried again after a
// growing, jittered pause, up to the configured attempts. It returns the events the bus
// acknowledged; err says why the others were not (nil when none is left).
func (p *Publisher) Publish(ctx context.Context, events []usage.Event) ([]usage.Event, error) {
	var (
		acked []usage.Event
		errs  []error
	)
	for len(events) > 0 {
		n := min(len(events), MaxEntries)
		ok, err := p.batch(ctx, events[:n])
		acked = append(acked, ok...)
		if err != nil {
			errs = append(errs, err)
		}
		events = events[n:]
		if ctx.Err() != nil {
			if len(events) > 0 {
				errs = append(errs, fmt.Errorf("%d events not sent: %w", len(events), ctx.Err()))
			}
			break
		}
	}
	return acked, errors.Join(errs...)
}

// batch sends one call's worth of events, retrying what fails.
func (p *Publisher) batch(ctx context.Context, events []usage.Event) ([]usage.Event, error) {
	entries := make([]types.PutEventsRequestEntry, len(events))
	for i, e := range events {
		detail, err := json.Marshal(e)
		if err != nil {
			return nil, fmt.Errorf("encode %s: %w", e.GenerationID, err)
		}
		entries[i] = types.PutEventsRequestEntry{
			EventBusName: aws.String(p.bus),
			Source:       aws.String(Source),
			DetailType:   aws.String(DetailType),
			Detail:       aws.String(string(detail)),
		}
	}
	pending := make([]int, len(events)) // indexes of events not yet acknowledged
	for i := range pending {
		pending[i] = i
	}
	var acked []usage.Event
	var last error
	pause := p.backoff
	for try := 1; ; try++ {
		in := &eventbridge.PutEventsInput{Entries: make([]types.PutEventsRequestEntry, len(pending))}
		for j, i := range pending {
			in.Entries[j] = entries[i]
		}
		out, err := p.api.PutEvents(ctx, in)
		var failed []int
		switch {
		case err != nil:
			failed, last = pending, fmt.Errorf("PutEvents: %w", err)
		case len(out.Entries) != len(pending):
			failed, last = pending, fmt.Errorf("PutEvents answered %d entries for %d", len(out.Entries), len(pending))
		default:
			for j, r := range out.Entries {
				if aws.ToString(r.ErrorCode) != "" || aws.ToString(r.EventId) == "" {
					failed = append(failed, pending[j])
					last = fmt.Errorf("PutEvents refused an entry: %s: %s", aws.ToString(r.ErrorCode), aws.ToString(r.ErrorMessage))
				} else {
					acked = append(acked, events[pending[j]])
				}
			}
		}
		if len(failed) == 0 {
			return acked, nil
		}
		pending = failed
		if try >= p.attempts {
			return acked, fmt.Errorf("%d of %d events not acknowledged after %d tries: %w", len(pending), len(events), try, last)
		}
		t := time.NewTimer(pause/2 + rand.N(pause/2+1))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return acked, fmt.Errorf("%d of %d events not acknowledged: %w (last: %v)", len(pending), len(events), ctx.Err(), last)
		}
		pause = min(2*pause, 2*time.Second)
	}
}
