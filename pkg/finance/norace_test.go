//go:build !race

package finance

const raceEnabled = false
