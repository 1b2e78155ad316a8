package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/neocloud/kiln/pkg/store/dynamo"
	"github.com/neocloud/kiln/pkg/usage"
	"github.com/neocloud/kiln/pkg/usage/pipe"
)

// aggregatorBatch is the aggregator's SQS batch size (template.yaml, the Usage event's BatchSize).
const aggregatorBatch = 100

// foldCost is what the usage pipeline did with the usage records the gateway wrote: the
// messages the pipe made of them, and the aggregator's fold, in DynamoDB write units per record.
type foldCost struct {
	records   int
	bodyBytes float64 // mean SQS message body: one stream record, as the pipe sends it
	// single is the units per record folded one at a time (each its own transaction), batched
	// per record folded aggregatorBatch at a time, as the aggregator now does.
	single, batched float64
	batchMS         float64 // ms to fold one batch, median (DynamoDB Local on loopback)
	err             error
}

// bodies is a pipe target that keeps what it is sent.
type bodies []string

func (b *bodies) Send(_ context.Context, batch []string) error {
	*b = append(*b, batch...)
	return nil
}

// measureFold reads the usage table's stream under prefix as the pipe does (pkg/usage/pipe,
// through the capacity counter), and folds the records as the aggregator does: the first half
// one at a time, the rest in batches of aggregatorBatch, on the aggregates table, counting the
// write units of each.
func measureFold(counter *capacityCounter, prefix string) (foldCost, error) {
	var f foldCost
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := dynamo.Open(ctx, dynamo.Config{Endpoint: counter.URL, TablePrefix: prefix, Region: "us-east-1"})
	if err != nil {
		return foldCost{}, err
	}
	arn, err := pipe.StreamOf(ctx, st.Client(), st.Tables().Usage)
	if err != nil {
		return foldCost{}, err
	}
	var sent bodies
	if _, err := pipe.New(st.Client(), arn, &sent, nil).Poll(ctx); err != nil {
		return foldCost{}, fmt.Errorf("read the usage stream: %w", err)
	}
	var es []usage.Event
	size := 0
	for _, b := range sent {
		e, err := usage.Decode([]byte(b))
		if errors.Is(err, usage.ErrNotFinal) {
			continue
		}
		if err != nil {
			return foldCost{}, fmt.Errorf("a message of the pipe: %w", err)
		}
		es = append(es, e)
		size += len(b)
	}
	if len(es) < 2*aggregatorBatch/10 {
		return foldCost{}, fmt.Errorf("%d usage records in the stream: too few to fold", len(es))
	}
	f.records, f.bodyBytes = len(es), float64(size)/float64(len(es))
	agg := usage.NewAggregator(st)
	half := len(es) / 2
	counter.take()
	for _, e := range es[:half] {
		if _, err := agg.Fold(ctx, e); err != nil {
			return foldCost{}, err
		}
	}
	f.single = writeUnits(counter) / float64(half)
	var took spread
	for i := half; i < len(es); i += aggregatorBatch {
		batch := es[i:min(i+aggregatorBatch, len(es))]
		start := time.Now()
		for _, err := range agg.RecordBatch(ctx, batch) {
			if err != nil {
				return foldCost{}, err
			}
		}
		took = append(took, ms(time.Since(start)))
	}
	f.batched = writeUnits(counter) / float64(len(es)-half)
	f.batchMS = took.median()
	return f, nil
}

// writeUnits is the write units counted since the last take.
func writeUnits(c *capacityCounter) float64 {
	ops, _ := c.take()
	w := 0.0
	for _, o := range ops {
		w += o.Write
	}
	return w
}
