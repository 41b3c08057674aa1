// Volcano scheduler for the local control plane (gang scheduling of training PodGroups).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/spf13/pflag"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	cliflag "k8s.io/component-base/cli/flag"
	componentbaseoptions "k8s.io/component-base/config/options"
	"k8s.io/klog/v2"

	"volcano.sh/volcano/cmd/scheduler/app"
	"volcano.sh/volcano/cmd/scheduler/app/options"
	_ "volcano.sh/volcano/pkg/scheduler/actions" // registers the actions named in the scheduler conf
	_ "volcano.sh/volcano/pkg/scheduler/plugins" // registers the plugins named in the scheduler conf
	_ "volcano.sh/volcano/pkg/scheduler/util/assert"
	commonutil "volcano.sh/volcano/pkg/util"
	"volcano.sh/volcano/pkg/version"
)

func main() {
	klog.InitFlags(nil)
	_ = flag.Set("legacy_stderr_threshold_behavior", "false")
	_ = flag.Set("stderrthreshold", "INFO")

	fs := pflag.CommandLine
	opts := options.NewServerOption()
	opts.AddFlags(fs)
	utilfeature.DefaultMutableFeatureGate.AddFlag(fs)
	commonutil.LeaderElectionDefault(&opts.LeaderElection)
	opts.LeaderElection.ResourceName = commonutil.GenerateComponentName(opts.SchedulerNames)
	componentbaseoptions.BindLeaderElectionFlags(&opts.LeaderElection, fs)
	opts.RegisterOptions()
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
