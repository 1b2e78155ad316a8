//go:build race

package finance

// raceEnabled: the race detector makes the large export's test several times slower, so it
// reads a smaller one (the bound it checks does not depend on the size).
const raceEnabled = true
