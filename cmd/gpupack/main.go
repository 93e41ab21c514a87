// Command gpupack is the offline CLI: `fit` (why is my job not admitted?),
// `mutate` (what will the webhook do to my job?) and `version`.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/gpupack/gpupack/admissioncheck/fitcli"
	"github.com/gpupack/gpupack/cmd/internal/version"
	"github.com/gpupack/gpupack/webhooks/mutatecli"
)

type command struct {
	help string
	run  func(args []string, stdin io.Reader, stdout, stderr io.Writer) int
}

var commands = map[string]command{
	"fit": {"would this workload fit now? (offline, from kubectl get -o yaml dumps)", func(args []string, _ io.Reader, out, errw io.Writer) int {
		return fitcli.Main(args, out, errw)
	}},
	"mutate": {"show what gpupack's webhooks do to a job or pod (offline)", mutatecli.Main},
	"version": {"print the version", func(_ []string, _ io.Reader, out, _ io.Writer) int {
		fmt.Fprintln(out, version.String())
		return 0
	}},
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: gpupack <command> [flags]\n\ncommands:")
	for _, name := range []string{"fit", "mutate", "version"} {
		if c, ok := commands[name]; ok {
			fmt.Fprintf(w, "  %-8s %s\n", name, c.help)
		}
	}
}

func main() {
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	c, ok := commands[os.Args[1]]
	if !ok {
		if os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
			usage(os.Stdout)
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "gpupack: unknown command %q\n", os.Args[1])
		usage(os.Stderr)
		os.Exit(2)
	}
	os.Exit(c.run(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
}
