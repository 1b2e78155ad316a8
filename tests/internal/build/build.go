// Package build builds the repository's commands for the suites that run them as processes, as
// their TestMain does before any test.
package build

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Repo is the repository's root, seen from a suite's directory (tests/<suite>), where go test
// runs it.
func Repo() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	return filepath.Clean(filepath.Join(wd, "..", "..")), nil
}

// Commands builds each package (a path from the repository's root, such as ./functions/gateway)
// into dir under the base name of its path, static (CGO_ENABLED=0), as the release is; it
// returns the binaries' paths in the order of pkgs.
func Commands(dir string, pkgs ...string) ([]string, error) {
	repo, err := Repo()
	if err != nil {
		return nil, err
	}
	return In(repo, dir, nil, pkgs...)
}

// In is Commands for the repository at repo, with flags added to go build's.
func In(repo, dir string, flags []string, pkgs ...string) ([]string, error) {
	bins := make([]string, len(pkgs))
	for i, pkg := range pkgs {
		bins[i] = filepath.Join(dir, filepath.Base(pkg))
		cmd := exec.Command("go", append(append([]string{"build", "-o", bins[i]}, flags...), pkg)...)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build %s: %v\n%s", pkg, err, out)
		}
	}
	return bins, nil
}
