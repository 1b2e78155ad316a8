// Command simserver serves the model simulator alone, with the reference catalog's backend model
// names, so that the benchmark can call it directly and put the gateway in front of it. It prints
// "listening on http://ADDR/v1" once it accepts connections.
package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/neocloud/kiln/pkg/simulator"
)

func main() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "simserver:", err)
		os.Exit(1)
	}
	sim := simulator.New(simulator.Config{Models: []simulator.Model{
		{Name: "Qwen/Qwen3-32B", ContextLength: 40960, RejectRequiredToolChoice: true},
		{Name: "openai/gpt-oss-120b", ContextLength: 131072},
	}})
	fmt.Printf("listening on http://%s/v1\n", ln.Addr())
	srv := &http.Server{Handler: sim, ReadHeaderTimeout: 10 * time.Second}
	if err := srv.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, "simserver:", err)
		os.Exit(1)
	}
}
