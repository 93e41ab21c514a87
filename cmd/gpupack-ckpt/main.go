// Command gpupack-ckpt is the in-pod checkpoint supervisor:
//
//	gpupack-ckpt [flags] -- CMD ARGS…
//
// See package github.com/gpupack/gpupack/checkpoint/agent. Built static
// (CGO_ENABLED=0) so an init container can copy it into any image.
package main

import (
	"os"

	"github.com/gpupack/gpupack/checkpoint/agent"
)

func main() {
	os.Exit(agent.Main(os.Args[1:]))
}
