// descheduler for the local control plane; it evicts through the eviction API like the in-cluster one.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"sigs.k8s.io/descheduler/cmd/descheduler/app"
)

func main() {
	root := app.NewDeschedulerCommand(os.Stdout)
	root.AddCommand(app.NewVersionCommand())
	os.Exit(cli.Run(root))
}
