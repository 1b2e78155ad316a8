package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// TestReleaseHasNoProfilingHook: net/http/pprof is linked only with -tags pprof (pprof.go), for
// kilnbench's live heap figure; the release build (tags lambda.norpc) does not carry it.
func TestReleaseHasNoProfilingHook(t *testing.T) {
	deps := func(tags string) []string {
		out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps", "-tags", tags, ".").CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps -tags %s: %v\n%s", tags, err, out)
		}
		return strings.Fields(string(out))
	}
	if slices.Contains(deps("lambda.norpc"), "net/http/pprof") {
		t.Error("the release build links net/http/pprof")
	}
	if !slices.Contains(deps("pprof"), "net/http/pprof") {
		t.Error("-tags pprof does not link net/http/pprof: kilnbench's live heap figure would find no listener")
	}
}
