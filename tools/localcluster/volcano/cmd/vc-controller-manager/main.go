// Volcano controllers for the local control plane: PodGroups for plain pods, Queues, batch Jobs.
package main

import (
	"flag"
	"fmt"
	"os"
	"sort"

	"github.com/spf13/pflag"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	cliflag "k8s.io/component-base/cli/flag"
	componentbaseoptions "k8s.io/component-base/config/options"
	"k8s.io/klog/v2"

	"volcano.sh/volcano/cmd/controller-manager/app"
	"volcano.sh/volcano/cmd/controller-manager/app/options"
	_ "volcano.sh/volcano/pkg/controllers/garbagecollector"
	_ "volcano.sh/volcano/pkg/controllers/job"
	_ "volcano.sh/volcano/pkg/controllers/podgroup"
	_ "volcano.sh/volcano/pkg/controllers/queue"
	"volcano.sh/volcano/pkg/controllers/framework"
	commonutil "volcano.sh/volcano/pkg/util"
	"volcano.sh/volcano/pkg/version"
)

// registered lists the controllers linked into this binary (the blank imports above).
func registered() []string {
	var names []string
	framework.ForeachController(func(c framework.Controller) { names = append(names, c.Name()) })
	sort.Strings(names)
	return names
}

func main() {
	klog.InitFlags(nil)
	_ = flag.Set("legacy_stderr_threshold_behavior", "false")
	_ = flag.Set("stderrthreshold", "INFO")

	fs := pflag.CommandLine
	opts := options.NewServerOption()
	opts.AddFlags(fs, registered())
	utilfeature.DefaultMutableFeatureGate.AddFlag(fs)
	commonutil.LeaderElectionDefault(&opts.LeaderElection)
	opts.LeaderElection.ResourceName = "vc-controller-manager"
	componentbaseoptions.BindLeaderElectionFlags(&opts.LeaderElection, fs)
	cliflag.InitFlags()

	if opts.PrintVersion {
		version.PrintVersionAndExit()
		return
	}
	if err := opts.CheckOptionOrDie(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer klog.Flush()
	if err := app.Run(opts); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
