// Command gpupack-node is the node agent DaemonSet: GPU inventory and NVLink
// topology, the device plugin that pins planned GPUs, the hook installer and
// the bypass watcher. See docs/node-agent.md.
package main

import (
	"os"

	"github.com/gpupack/gpupack/devicehook/node/agent"
)

func main() { os.Exit(agent.Main(os.Args[1:])) }
