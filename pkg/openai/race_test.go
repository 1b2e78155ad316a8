//go:build race

package openai

// raceEnabled: under the race detector sync.Pool drops items at random, so the pooled decoder is
// sometimes made anew and allocation counts mean nothing.
const raceEnabled = true
