package bench

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
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
		c, err := procCounters(path, "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")
		if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
			continue // the thread exited meanwhile: its file is gone or cannot be read
		}
		if err != nil {
			return 0, err
		}
		n += c
	}
	return n, nil
}
