package storetest

import (
	"slices"
	"testing"
	"time"
)

// ReportAdmitSettle reports the p50 and p99 of a store benchmark's timed admissions and
// settlements, in ms, under the metric names make bench's store table reads
// (admit-p50-ms, admit-p99-ms, settle-p50-ms, settle-p99-ms).
func ReportAdmitSettle(b *testing.B, admits, settles []time.Duration) {
	for _, m := range []struct {
		name string
		d    []time.Duration
	}{{"admit", admits}, {"settle", settles}} {
		if len(m.d) == 0 {
			continue
		}
		slices.Sort(m.d)
		b.ReportMetric(float64(m.d[len(m.d)/2].Microseconds())/1000, m.name+"-p50-ms")
		b.ReportMetric(float64(m.d[len(m.d)*99/100].Microseconds())/1000, m.name+"-p99-ms")
	}
}
