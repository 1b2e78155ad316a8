package bench

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// latencies is one phase's request latencies, sorted once before quantiles are read.
type latencies []time.Duration

func (l latencies) sorted() latencies { return slices.Sorted(slices.Values(l)) }

// q is the nearest-rank quantile of a sorted sample; 0 when empty.
func (l latencies) q(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(l)))) - 1
	return l[min(max(i, 0), len(l)-1)]
}

// spread is a figure measured once per round: its median and range over the rounds.
type spread []float64

func (s spread) median() float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	c := slices.Sorted(slices.Values(s))
	if n := len(c); n%2 == 0 {
		return (c[n/2-1] + c[n/2]) / 2
	}
	return c[len(c)/2]
}

// fmt prints "median (lo … hi)" with format f for each number.
func (s spread) fmt(f string) string {
	if len(s) == 0 {
		return "–"
	}
	if len(s) == 1 {
		return fmt.Sprintf(f, s[0])
	}
	return fmt.Sprintf(f+" ("+f+" … "+f+")", s.median(), slices.Min(s), slices.Max(s))
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// alternate is items in round r's order: as they are in even rounds, reversed in odd ones
// (-1 among them), so that a steady drift in the machine's speed hits every item alike.
func alternate[T any](r int, items []T) []T {
	s := slices.Clone(items)
	if r%2 != 0 {
		slices.Reverse(s)
	}
	return s
}
