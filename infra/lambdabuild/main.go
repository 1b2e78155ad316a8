// Command lambdabuild builds a Lambda function of this module as the provided.al2023 runtime
// wants it: a static linux binary named bootstrap, built with -tags lambda.norpc (no RPC mode:
// the Runtime API only), CGO_ENABLED=0, -trimpath and stripped symbols; optionally with a catalog
// file beside it, and optionally zipped with reproducible timestamps and the executable bit set.
// The Makefile's release targets (arm64), `sam build` (BuildMethod: makefile) and tests/lambda
// (this machine's architecture) all build through it, so they build the same thing.
//
// With -release (sam build's targets) it refuses a catalog whose backends are loopback or
// link-local: on Lambda nothing answers there.
//
//	go run ./infra/lambdabuild [-arch arm64] [-dir DIR] [-zip FILE] [-catalog FILE] [-release] ./functions/NAME
package main

import (
	"archive/zip"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// Flags are the build flags of every Lambda binary.
var Flags = []string{"-tags", "lambda.norpc", "-trimpath", "-buildvcs=false", "-ldflags=-s -w"}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "lambdabuild:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("lambdabuild", flag.ContinueOnError)
	arch := fs.String("arch", "arm64", "GOARCH of the function (arm64 in the template)")
	dir := fs.String("dir", "", "write bootstrap (and catalog.yaml) into this directory")
	zipPath := fs.String("zip", "", "write a deployment package with bootstrap (and catalog.yaml) to this file")
	catalog := fs.String("catalog", "", "catalog file to package as catalog.yaml beside bootstrap")
	release := fs.Bool("release", false, "a deployment: refuse a catalog whose backends are loopback or link-local")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *release {
		if err := checkRelease(*catalog); err != nil {
			return err
		}
	}
	if fs.NArg() != 1 || (*dir == "" && *zipPath == "") {
		return errors.New("usage: lambdabuild [-arch arm64] [-dir DIR] [-zip FILE] [-catalog FILE] [-release] ./functions/NAME")
	}
	out := *dir
	if out == "" {
		tmp, err := os.MkdirTemp("", "lambdabuild-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		out = tmp
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	bootstrap := filepath.Join(out, "bootstrap")
	cmd := exec.Command("go", append(append([]string{"build"}, Flags...), "-o", bootstrap, fs.Arg(0))...)
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+*arch, "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w", fs.Arg(0), err)
	}
	files := []packaged{{name: "bootstrap", path: bootstrap, mode: 0o755}}
	if *catalog != "" {
		dst := filepath.Join(out, "catalog.yaml")
		b, err := os.ReadFile(*catalog)
		if err == nil {
			err = os.WriteFile(dst, b, 0o644)
		}
		if err != nil {
			return fmt.Errorf("catalog: %w", err)
		}
		files = append(files, packaged{name: "catalog.yaml", path: dst, mode: 0o644})
	}
	if *zipPath != "" {
		if err := writeZip(*zipPath, files); err != nil {
			return fmt.Errorf("zip %s: %w", *zipPath, err)
		}
	}
	return nil
}

type packaged struct {
	name, path string
	mode       os.FileMode
}

// writeZip writes files with a fixed timestamp, so that an unchanged build gives an identical
// package and CloudFormation sees no code change.
func writeZip(path string, files []packaged) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close() // a second Close after the one below only fails
	zw := zip.NewWriter(f)
	for _, p := range files {
		h := &zip.FileHeader{Name: p.name, Method: zip.Deflate, Modified: time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)}
		h.SetMode(p.mode) // Lambda runs bootstrap only with its executable bit
		w, err := zw.CreateHeader(h)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p.path)
		if err != nil {
			return err
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return f.Close()
}
