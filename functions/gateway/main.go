// Command gateway is Kiln's public API, and its composition root: configuration → store →
// catalog → backends → gateway.New → a server. On AWS Lambda (AWS_LAMBDA_RUNTIME_API set) it
// serves the function URL and the API Gateway REST API, both with response streaming, on the
// store the configuration names (DynamoDB by default there; lambda.go). Off Lambda it serves HTTP
// on KILN_ADDR with the configured store (serve.go, with conn.go's JSON answers for what net/http
// refuses itself and logbuf.go's batched log); `make run` starts it with the built-in model
// simulator as the reference catalog's backend and a demo organization (demo.go), and, on a local
// DynamoDB, a stand-in for the usage pipeline's EventBridge Pipe (pipe.go).
//
// The release build is linux/arm64 with -tags lambda.norpc and CGO_ENABLED=0 (infra/lambdabuild).
package main

import (
	"context"
	"fmt"
	stdlog "log"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/neocloud/kiln/pkg/config"
)

func main() {
	cfg, err := config.Load(os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gateway: configuration:\n%v\n", err)
		os.Exit(2)
	}
	if cfg.OnLambda {
		if os.Getenv("GOMAXPROCS") == "" {
			// An execution environment serves one request at a time, whose goroutines mostly
			// wait for the network, on less than one vCPU's share below 1,769 MB: a second P
			// buys next to no parallelism and wakes threads to look for work. With one, the
			// bootstrap made half the futex and nanosleep calls per request at 20 req/s.
			runtime.GOMAXPROCS(1)
		}
		log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
		stdlog.SetFlags(0)
		stdlog.SetOutput(stdLog{log})
		h, err := lambdaHandler(context.Background(), cfg, os.Getenv, log)
		if err != nil {
			log.Error("gateway did not start", slog.String("error", err.Error()))
			os.Exit(1)
		}
		lambda.StartHandlerFunc(h.Invoke) // returns only by exiting the process
		return
	}
	log, flushLog := newLogger(os.Stderr, cfg.LogLevel, logFlushEvery)
	stdlog.SetFlags(0)
	stdlog.SetOutput(stdLog{log})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = serve(ctx, cfg, os.Getenv, log, os.Stdout)
	stop()
	if err != nil {
		log.Error("gateway stopped", slog.String("error", err.Error()))
	}
	_ = flushLog()
	if err != nil {
		os.Exit(1)
	}
}
