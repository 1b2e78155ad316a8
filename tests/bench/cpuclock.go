package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// processCPU is the CPU time the process has used so far, to the nanosecond, from the
// scheduler's own count of it: the process's CPU-time clock (clock_getcpuclockid(3)), which
// Linux lets any process read for another. /proc/PID/stat's utime and stime hold the same
// total in 10 ms ticks, too coarse for a phase that spends a fraction of a second of CPU.
func processCPU(pid int) (time.Duration, error) {
	// MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED) of the kernel's posix-timers.h.
	clock := (^pid << 3) | 2
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, uintptr(clock), uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return 0, fmt.Errorf("CPU clock of process %d: %w", pid, errno)
	}
	return time.Duration(ts.Nano()), nil
}

// contextSwitches is how many times the process's threads have left the CPU so far, to wait
// (voluntary: a futex, a sleep, a read with nothing to read) or preempted, summed over its
// threads from /proc/PID/task/*/status. Threads that have exited are not counted; Go's seldom
// exit.
func contextSwitches(pid int) (int64, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		return 0, fmt.Errorf("threads of process %d: none found", pid)
	}
	var n int64
	for _, path := range tasks {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the thread exited meanwhile
		}
		for line := range strings.Lines(string(b)) {
			k, v, ok := strings.Cut(line, ":")
			if !ok || k != "voluntary_ctxt_switches" && k != "nonvoluntary_ctxt_switches" {
				continue
			}
			c, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: bad %s", path, k)
			}
			n += c
		}
	}
	return n, nil
}
