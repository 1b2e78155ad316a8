package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// proc is a started child process whose stdout is scanned for its listen line.
type proc struct {
	name    string
	cmd     *exec.Cmd
	base    string    // "http://ADDR/v1", from the "listening on" line
	started time.Time // just before its exec
}

var listenLine = regexp.MustCompile(`listening on (http://\S+/v1)`)

// start runs bin with env, sends its stderr to logPath, and waits for its "listening on" line.
func start(name, bin string, args, env []string, logPath string) (*proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, started: time.Now()}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	logf.Close() // the child holds its own descriptor
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := listenLine.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case p.base = <-found:
		return p, nil
	case <-time.After(20 * time.Second):
		p.stop()
		logText, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("%s did not print its listen line in 20 s; stderr:\n%s", name, logText)
	}
}

// stop sends SIGTERM and waits up to 5 s, then kills.
func (p *proc) stop() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// host is the address the process listens on, "HOST:PORT".
func (p *proc) host() string { return strings.TrimSuffix(strings.TrimPrefix(p.base, "http://"), "/v1") }

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

// syscalls is how many read- and write-family system calls the process has made so far
// (/proc/PID/io syscr + syscw: read, readv, pread and write, writev, pwrite, which Go's network
// I/O uses, not the socket calls recv and send). A read that finds nothing to read and makes the
// caller wait counts too.
func syscalls(pid int) (int64, error) {
	return procCounters(fmt.Sprintf("/proc/%d/io", pid), "syscr", "syscw")
}

// rss is the process's resident set size in bytes (VmRSS).
func rss(pid int) (int64, error) {
	kb, err := procCounters(fmt.Sprintf("/proc/%d/status", pid), "VmRSS")
	return kb << 10, err
}

// procCounters is the sum of the "key: value" lines of a /proc file with the given keys (a
// trailing unit such as " kB" dropped), each of which must be there.
func procCounters(path string, keys ...string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var n int64
	found := 0
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !slices.Contains(keys, k) {
			continue
		}
		num, _, _ := strings.Cut(strings.TrimSpace(v), " ")
		c, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: bad %s", path, k)
		}
		n += c
		found++
	}
	if found != len(keys) {
		return 0, fmt.Errorf("%s: not every one of %s", path, strings.Join(keys, ", "))
	}
	return n, nil
}
