package bench

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// lambdaFullCoreMB is the memory size at which Lambda gives a function one whole vCPU; below it,
// CPU is in proportion to memory.
const lambdaFullCoreMB = 1769

// cfsPeriodMicros is the period over which a CPU quota is counted: 100 ms, as in Lambda's own
// cgroup. What matters for a function is how much CPU it may use per period, not how many cores
// the host has.
const cfsPeriodMicros = 100_000

// cgroupRoot is where the machine mounts its cgroups.
const cgroupRoot = "/sys/fs/cgroup"

// cpuLimit is a cgroup that holds the processes put in it to a share of one core per 100 ms
// period: cgroup v2's cpu.max where the machine has a v2 cpu controller, v1's CFS quota
// (cpu.cfs_quota_us over cpu.cfs_period_us) otherwise. Making one needs root.
type cpuLimit struct {
	dir string // the cgroup's folder
}

// cgroupController names the mechanism newCPULimit uses on this machine, for the report.
func cgroupController() string {
	if hasV2CPU() {
		return "cgroup v2 `cpu.max`"
	}
	return "cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`"
}

// hasV2CPU reports whether the unified hierarchy is mounted at the root with a cpu controller.
func hasV2CPU() bool {
	b, err := os.ReadFile(filepath.Join(cgroupRoot, "cgroup.controllers"))
	return err == nil && slices.Contains(strings.Fields(string(b)), "cpu")
}

// newCPULimit makes the cgroup name holding its processes to memoryMB/1,769 of a core, as Lambda
// does a function of that much memory.
func newCPULimit(name string, memoryMB int) (*cpuLimit, error) {
	quota := int(math.Round(cfsPeriodMicros * float64(memoryMB) / lambdaFullCoreMB))
	l := &cpuLimit{}
	var files [][2]string
	if hasV2CPU() {
		// The root's children get a cpu controller only when the root hands it down.
		if err := os.WriteFile(filepath.Join(cgroupRoot, "cgroup.subtree_control"), []byte("+cpu"), 0); err != nil {
			return nil, fmt.Errorf("enable the cpu controller: %w", err)
		}
		l.dir = filepath.Join(cgroupRoot, name)
		files = [][2]string{{"cpu.max", fmt.Sprintf("%d %d", quota, cfsPeriodMicros)}}
	} else {
		l.dir = filepath.Join(cgroupRoot, "cpu", name)
		files = [][2]string{{"cpu.cfs_period_us", strconv.Itoa(cfsPeriodMicros)}, {"cpu.cfs_quota_us", strconv.Itoa(quota)}}
	}
	if err := os.Mkdir(l.dir, 0o755); err != nil {
		return nil, fmt.Errorf("cgroup for %d MB (needs root): %w", memoryMB, err)
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(l.dir, f[0]), []byte(f[1]), 0); err != nil {
			l.remove()
			return nil, fmt.Errorf("cgroup %s: %s: %w", l.dir, f[0], err)
		}
	}
	return l, nil
}

// procs is the file a process id is written to, to move that process into the cgroup.
func (l *cpuLimit) procs() string { return filepath.Join(l.dir, "cgroup.procs") }

// throttled reads from cpu.stat how many periods the cgroup's processes were held back in; 0
// without a limit.
func (l *cpuLimit) throttled() (periods int64, err error) {
	if l == nil {
		return 0, nil
	}
	b, err := os.ReadFile(filepath.Join(l.dir, "cpu.stat"))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "nr_throttled "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s/cpu.stat: no nr_throttled", l.dir)
}

// remove deletes the cgroup; its processes must have exited. A cgroup left behind is harmless
// to the run, so the error is not reported.
func (l *cpuLimit) remove() {
	if l != nil {
		_ = os.Remove(l.dir)
	}
}
