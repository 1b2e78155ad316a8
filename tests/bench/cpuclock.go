package bench

import (
	"fmt"
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
